# call A: GPU tests, profile mini (with runtime.cpu_call_s), mini sweep at Cache 40
source .val/common.sh
timeout 120 python -m pytest -q -m gpu tests/ > .val/sweep/gpu_tests.txt 2>&1; log "gpu tests rc=$?"; tail -3 .val/sweep/gpu_tests.txt
[ -f .val/sweep/profile-mini.json ] || { timeout 150 python -m hwprofile --model mini --out .val/sweep/profile-mini.json > .val/sweep/prof_mini.txt 2>&1; log "prof mini rc=$?"; }
python -c "import json; p=json.load(open('.val/sweep/profile-mini.json')); print('runtime', p.get('runtime'), 'cpu ovh', p['curves']['cpu_expert']['call_overhead_s'])"
V mini 40
