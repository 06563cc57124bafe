#!/bin/bash
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
timeout 150 python3 -m pytest -m gpu tests/test_gpu_msm.py -q -p no:cacheprovider -k "radix or sorts or large or default_accumulation" > $OUT/tests.log 2>&1
rc=$?; el "tests rc=$rc"; tail -3 $OUT/tests.log
if [ $rc -ne 0 ]; then grep -E "^E |FAILED" $OUT/tests.log | head -30; exit 1; fi
timeout 90 python3 perf/gpu_msm_bench.py --accumulate --lg 27 --groups g1 --dists random --variants xyzz --reps 2 --out $OUT/msm27.json 2>&1 | tail -2; el msm27

timeout 80 python3 perf/gpu_msm_bench.py --accumulate --lg 24 --groups g1,g2 --dists random --variants xyzz --reps 3 --out $OUT/msm24.json 2>&1 | tail -3; el msm24
mkdir -p $OUT/p27
PY=python3 timeout 330 bash perf/pipeline_bench.sh gpu-2^27 $OUT/p27 > $OUT/p27.log 2>&1; el "pipeline rc=$?"
tail -25 $OUT/p27.log
cd $OUT && tar czf p27.tgz p27 && rm -rf p27
