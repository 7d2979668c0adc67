#!/usr/bin/env bash
# The authors-network hammer screen (docs/results.md §7): hammer-v3 alone under cw10's rules, RL
# protocol, 1M steps, one run after another once WAIT_PID has ended (999999: at once).
#
#   sphere_authors.sh WAIT_PID NAME:METHOD:SEED:PRESET[:SET SET ...] ...
#
# Runs go to $RUNS/NAME-sSEED (RUNS defaults to ~/rl_moe-runs/sphere-authors); WORKTREE and VENV
# name the pinned checkout and its venv (defaults ~/rl_moe-exp and ~/venv-exp). Rerunning the same
# line skips finished runs and resumes an unfinished one inside its task.
set -u
wait_pid=$1; shift
runs=${RUNS:-~/rl_moe-runs/sphere-authors}; wt=${WORKTREE:-~/rl_moe-exp}; venv=${VENV:-~/venv-exp}
while kill -0 "$wait_pid" 2>/dev/null; do sleep 20; done
for spec in "$@"; do
  IFS=: read -r name method seed preset sets <<<"$spec"
  d=$runs/$name-s$seed; mkdir -p "$d"
  if [ -f "$d/results.json" ] && grep -q '"complete": true' "$d/results.json"; then continue; fi
  extra=(); [ -n "$preset" ] && extra+=(--preset "$preset"); for s in $sets; do extra+=(--set "$s"); done
  cmd=(python -m rl_moe.crl --suite results/suites/paper-hammer.json --method "$method" --protocol rl --seed "$seed"
       --run-dir "$d" --no-progress --vec-env dummy --threads 1 --set probe.online=true "${extra[@]}")
  echo "\$ cd $wt && ${cmd[*]}" >> "$d/sweep.log"
  (cd "$wt" && OMP_NUM_THREADS=1 nice -n 10 "$venv/bin/${cmd[@]}" >> "$d/sweep.log" 2>&1)
done
