#!/usr/bin/env bash
# One call of a lent accelerator: parts of the accelerator suite, each in a process of its own under
# a time limit, their results packed into one file (a call returns eight files at most).
#
#   bash benchmarks/device_call.sh PART:SECONDS[:NAME=VALUE] ...
#
# PART runs as `python3 -m benchmarks suite --suite=gpu --parts=PART $SUITE_ARGS` into $RESULTS/PART
# (into $RESULTS/PART-VALUE's letters and digits when NAME=VALUE is added to its environment, e.g.
# clients64:60:XLA_FLAGS=--xla_gpu_autotune_level=0), stopped by SIGINT after SECONDS (a part writes
# the rows it has, and a resumable part goes on from them in the next call). Wheels carried in .whl/
# are installed first. $OUT/log.txt gets the versions, each part's output and its exit status;
# $OUT/results.tar.gz the result folders. RESUME=<a results.tar.gz carried along> unpacks an earlier
# call's results first, so that `batch` and `convnet` go on where they stopped.
# SUITE_ARGS defaults to --suite_dataset=skimage; SUITE_ARGS=--quick runs it all on a CPU.
set -u
OUT=${OUT:?OUT is the folder whose files come back}
RESULTS=${RESULTS:-/tmp/gradjax_suite}
SUITE_ARGS=${SUITE_ARGS:---suite_dataset=skimage}
LOG=$OUT/log.txt
mkdir -p "$RESULTS"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
if [ -n "${RESUME:-}" ]; then
  tar xzf "$RESUME" -C "$RESULTS" || exit 1
fi
{
  date
  nvidia-smi -L 2>/dev/null
  python3 -c "import jax, flax, optax; print(jax.__version__, flax.__version__, optax.__version__, jax.devices())"
  git log -1 --format='commit %H' 2>/dev/null
} >>"$LOG" 2>&1
for spec in "$@"; do
  part=${spec%%:*}
  rest=${spec#*:}
  seconds=${rest%%:*}
  assignment=
  [ "$rest" != "$seconds" ] && assignment=${rest#*:}
  folder=$part
  [ -n "$assignment" ] && folder=$part-$(printf '%s' "${assignment#*=}" | tr -c 'A-Za-z0-9' '_' | cut -c1-40)
  start=$(date +%s)
  # shellcheck disable=SC2086  # SUITE_ARGS is a list of flags
  env ${assignment:+"$assignment"} timeout -s INT -k 15 "$seconds" python3 -m benchmarks suite \
    --suite=gpu --parts="$part" $SUITE_ARGS --output_dir="$RESULTS/$folder" >>"$LOG" 2>&1
  echo "PART $spec exit $? in $(( $(date +%s) - start )) s" >>"$LOG"
done
tar czf "$OUT/results.tar.gz" -C "$RESULTS" . && echo "packed $(du -h "$OUT/results.tar.gz" | cut -f1)" >>"$LOG"
