#!/usr/bin/env bash
# Slice runs for issue 45 (hammer -> push-wall -> faucet-close, CRL, cw10-paper's rules, 1M steps per task).
# commit 38279e8 (fast path, bit-identical to 4ec34fb per tests/test_metaworld_fast.py), worktree ~/rl_moe-exp3, venv ~/venv-exp3
# usage: queue.sh WAIT_PID METHOD:SEED [METHOD:SEED ...]   (METHOD may carry --set strings after a second colon)
# TASKS=10 continues a finished slice run over all of CW10 in its own folder (issue 45, item 2); the default is the slice (3).
wait_pid=$1; shift
while kill -0 "$wait_pid" 2>/dev/null; do sleep 20; done
for spec in "$@"; do
  method=${spec%%:*}; rest=${spec#*:}; seed=${rest%%:*}; sets=""; [ "$rest" != "$seed" ] && sets=${rest#*:}
  name=${NAME_PREFIX:-ppo-$method}-crl-s$seed
  d=~/rl_moe-runs/cw10-paper/$name; mkdir -p "$d"
  extra=(); for s in $sets; do extra+=(--set "$s"); done
  cmd=(python -m rl_moe.crl --suite cw10-paper --method "$method" --algo ppo --protocol crl --seed "$seed" --run-dir "$d" --no-progress --vec-env dummy --threads 1 --tasks "${TASKS:-3}" --set probe.online=true "${extra[@]}")
  echo "\$ ${cmd[*]}   # commit 38279e8, worktree ~/rl_moe-exp3, venv ~/venv-exp3, $(date -u +%FT%TZ)" >> "$d/sweep.log"
  (cd ~/rl_moe-exp3 && OMP_NUM_THREADS=1 nice -n 10 ~/venv-exp3/bin/"${cmd[@]}" >> "$d/sweep.log" 2>&1)
  # a finished run's tasks scored on 25 held-out positions besides the training ones (issue 45, item 1)
  # (again after a continuation: results.json newer than the scores)
  if grep -q '"complete": true' "$d/results.json" 2>/dev/null && { [ ! -f "$d/positions-25.json" ] || [ "$d/results.json" -nt "$d/positions-25.json" ]; }; then
    (cd ~/rl_moe-exp3 && OMP_NUM_THREADS=1 nice -n 10 ~/venv-exp3/bin/python -m rl_moe.positions "$d" --heldout 25 >> "$d/sweep.log" 2>&1)
  fi
done
