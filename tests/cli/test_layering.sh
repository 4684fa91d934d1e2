# The layer check (tests/check_layers.sh) against planted violations in a copy of the layer table:
# a lower layer including a higher one, a public header including src/, a folder outside the
# table; and the real tree passing it.
source "$(dirname "$0")/lib.sh"

checker="$DDP_SOURCE_DIR/tests/check_layers.sh"
tree="$WORK/tree"
mkdir -p "$tree/docs" "$tree/include/ddp" "$tree/src/core" "$tree/src/train"
cp "$DDP_SOURCE_DIR/docs/architecture.md" "$tree/docs/"
printf '#include "core/a.h"\n#include "train/loop.h"\n#include <vector>\n' >"$tree/src/train/loop.cpp"
printf '#pragma once\n#include "ddp/config.h"\n' >"$tree/src/core/a.h"
: >"$tree/include/ddp/config.h"

checks=$((checks + 1))
if out="$(bash "$checker" "$tree" 2>&1)" && [[ "$out" == *"follow the order"* ]]; then
  pass "downward includes pass"
else
  fail "downward includes refused: $out"
fi

printf '#include "core/a.h"\n#include "train/loop.h"\n' >"$tree/src/core/b.cpp"
printf '#include "core/a.h"\n' >"$tree/include/ddp/trainer.h"
mkdir -p "$tree/src/extra"
checks=$((checks + 1))
out="$(bash "$checker" "$tree" 2>&1)"
code=$?
if ((code == 1)) &&
  [[ "$out" == *'src/core/b.cpp:2: includes "train/loop.h": train/ is below core/'* ]] &&
  [[ "$out" == *'include/ddp/trainer.h:1: includes "core/a.h": core/ is below ddp/'* ]] &&
  [[ "$out" == *"src/extra/: not a layer of docs/architecture.md's table"* ]] &&
  [[ "$out" == *"3 violation(s) of the layer order"* ]]; then
  pass "an upward include, a public header including src/ and a stray folder: refused (exit 1)"
else
  fail "planted violations (exit $code): $out"
fi

checks=$((checks + 1))
if out="$(bash "$checker" "$DDP_SOURCE_DIR" 2>&1)"; then
  pass "the source tree: $out"
else
  fail "the source tree breaks its layering: $out"
fi

finish
