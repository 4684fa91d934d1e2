# ddp-train --list-config-keys: the schema as a table, without --config and without MPI; its
# keys are exactly the keys --print-config writes over the data formats (synthetic, csv, idx, npy).
source "$(dirname "$0")/lib.sh"


# The key paths of --print-config's block YAML (two spaces per level), one per line.
yaml_keys() {
  awk '/^#/ { next }
       { depth = match($0, /[^ ]/) - 1; depth /= 2
         key = $1; sub(/:$/, "", key); sub(/:.*/, "", key)
         path[depth] = key; full = path[0]
         for (i = 1; i <= depth; ++i) full = full "." path[i]
         if ($0 ~ /:$/) next
         print full }'
}

listing="$(timeout 30 "$DDP_TRAIN" --list-config-keys 2>&1)"
rc=$?
echo "$listing" | head -4
check "--list-config-keys exits 0 without --config" test "$rc" -eq 0
check "a header line" grep -qE '^key +type +default +allowed +format +resume +doc$' <<<"$listing"
check "enum values listed" grep -qE '^device +string +"cpu" +cpu, cuda, auto ' <<<"$listing"
check "resume keys marked" grep -qE '^training\.seed .* must match ' <<<"$listing"
listed="$(tail -n +2 <<<"$listing" | awk '{ print $1 }' | sort)"

printed=""
for args in "--config $DDP_SOURCE_DIR/configs/seed.yaml" \
  "--config $DDP_SOURCE_DIR/configs/csv_example.yaml --set data.dir=$DDP_SOURCE_DIR"; do
  printed+="$("$DDP_TRAIN" $args --print-config | yaml_keys)"$'\n'
done
cat >"$WORK/idx.yaml" <<YAML
model: {layers: [4, 3]}
data: {format: idx, train: {images: $WORK/i, labels: $WORK/l}}
YAML
touch "$WORK/i" "$WORK/l"
printed+="$("$DDP_TRAIN" --config "$WORK/idx.yaml" --print-config | yaml_keys)"$'\n'
printed+="$("$DDP_TRAIN" --config "$WORK/idx.yaml" --set data.format=npy --set data.train.images= \
  --set "data.train.features=$WORK/i" --print-config | yaml_keys)"
printed="$(sort -u <<<"$printed" | sed '/^$/d')"
check "the listed keys are the printed config's keys ($(wc -l <<<"$listed") keys)" \
  test "$listed" == "$printed"
if [[ "$listed" != "$printed" ]]; then diff <(echo "$listed") <(echo "$printed"); fi

out="$("$DDP_TRAIN" 2>&1)"
rc=$?
check "--config is still required for training" test "$rc" -ne 0
check "the message says so" grep -q -- "--config is required" <<<"$out"

finish
