# sourced by the sweep calls: install the carried wheels, time guard, pack .val/sweep3 into $OUT on exit
# (after each call: tar xzf /work/.device/N/val.tgz in the repo root before the next call, which carries .val)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit 1
mkdir -p .val/sweep3
S=$SECONDS; END=${END:-540}; log() { echo "[$(date +%T) +$((SECONDS-S))s] $*" | tee -a .val/sweep3/times.txt; }
pack() { tar czf "$OUT/val.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' .val/sweep3; }; trap pack EXIT
rem() { echo $((END - (SECONDS-S))); }
