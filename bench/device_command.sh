# The accelerator benchmark on the lent TPU machine (bench/README.md, "On an accelerator"): run from the
# repository root there as `bash bench/device_command.sh`, with `.device-wheels` carried (`make device-wheels`
# fills it here). Installs the carried wheels beside the machine's own JAX, then writes $OUT/bench-device.json
# and $OUT/bench-device.log.
set -o pipefail
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .device-wheels/*.whl || exit
export PYTHONPATH=$PYTHONPATH:/tmp/site PYTHONUNBUFFERED=1
python3 -m bench.device --out "${OUT:-.}/bench-device.json" "$@" 2>&1 | tee "${OUT:-.}/bench-device.log"
