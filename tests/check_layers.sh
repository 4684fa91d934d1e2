#!/usr/bin/env bash
# The layering of src/ as docs/architecture.md states it: "a layer uses the ones above it in
# this table, never those below". Reads the order of the layer folders from that table's rows
# (`include/ddp/`, then `src/<layer>/` in order) and checks every #include "..." of every file
# under include/ddp/ and src/: a file may include its own layer's headers and those of layers
# above it, never a lower layer's; the public headers include only public headers.
#   tests/check_layers.sh [ROOT]
# Prints each offending include as file:line: and a summary; exits 1 if there is any.
set -euo pipefail

root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
doc="$root/docs/architecture.md"
[[ -f "$doc" ]] || { echo "check_layers.sh: no $doc" >&2; exit 2; }

# The table's first cells, in order: `include/ddp/` is layer 0, each `src/X/` the next.
mapfile -t layers < <(sed -n -E 's#^\| `(include/ddp|src/[a-z_]+)/` \|.*#\1#p' "$doc")
((${#layers[@]} > 2)) || { echo "check_layers.sh: no layer table in $doc" >&2; exit 2; }
declare -A rank
for i in "${!layers[@]}"; do
  name="${layers[$i]#src/}"
  [[ "${layers[$i]}" == include/ddp ]] && name=ddp
  rank[$name]=$i
done

# Every folder under src/ must be a layer of the table.
bad=0
for dir in "$root"/src/*/; do
  layer="$(basename "$dir")"
  if [[ -z "${rank[$layer]+x}" ]]; then
    echo "src/$layer/: not a layer of docs/architecture.md's table"
    bad=$((bad + 1))
  fi
done

checked=0
while IFS= read -r file; do
  rel="${file#"$root"/}"
  if [[ "$rel" == include/ddp/* ]]; then
    own=ddp
  else
    own="${rel#src/}"
    own="${own%%/*}"
  fi
  [[ -n "${rank[$own]+x}" ]] || continue
  while IFS=: read -r line target; do
    used="${target%%/*}"
    [[ "$target" == */* && -n "${rank[$used]+x}" ]] || continue
    checked=$((checked + 1))
    if ((rank[$used] > rank[$own])); then
      echo "$rel:$line: includes \"$target\": $used/ is below $own/ in docs/architecture.md"
      bad=$((bad + 1))
    fi
  done < <(grep -n -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$file" |
             sed -E 's/^([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1:\2/')
done < <(find "$root/include/ddp" "$root/src" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) | sort)

order="$(printf '%s/ ' "${layers[@]}")"
if ((bad > 0)); then
  echo "check_layers.sh: $bad violation(s) of the layer order: $order"
  exit 1
fi
echo "check_layers.sh: $checked includes across layers follow the order: $order"
