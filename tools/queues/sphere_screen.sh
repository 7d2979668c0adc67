#!/usr/bin/env bash
# Screen of SPHERE variants (docs/results.md §6, test 2): faucet-close RL 1M under cw10-paper's rules.
# Each lane waits for one slice run to end, then runs its screen trials one after another.
# commit 38279e8 (fast path, bit-identical to 4ec34fb per tests/test_metaworld_fast.py), worktree ~/rl_moe-exp3, venv ~/venv-exp3
lane() {
  wait_pid=$1; shift
  while kill -0 "$wait_pid" 2>/dev/null; do sleep 20; done
  for spec in "$@"; do
    name=${spec%%:*}; rest=${spec#*:}; method=${rest%%:*}; seed=${rest#*:}; seed=${seed%%:*}; sets=${spec#*:*:*:}
    [ "$sets" = "$spec" ] && sets=""
    d=~/rl_moe-runs/screen/$name-s$seed; mkdir -p "$d"
    extra=(); for s in $sets; do extra+=(--set "$s"); done
    cd ~/rl_moe-exp3 && echo "\$ python -m rl_moe.crl --suite results/suites/paper-faucet-close.json --method $method --protocol rl --seed $seed --run-dir $d --no-progress --vec-env dummy --threads 1 --set probe.online=true ${extra[*]}" > "$d/sweep.log"
    OMP_NUM_THREADS=1 nice -n 10 ~/venv-exp3/bin/python -m rl_moe.crl --suite results/suites/paper-faucet-close.json --method "$method" --protocol rl \
      --seed "$seed" --run-dir "$d" --no-progress --vec-env dummy --threads 1 --set probe.online=true "${extra[@]}" >> "$d/sweep.log" 2>&1
  done
}
lane "$1" "sphere_guard:sphere_guard:0" "lossratio:sphere:0:reg.sphere.coef_mode=loss_ratio reg.sphere.rho=0.05" "sphere_guard:sphere_guard:1" &
lane "$2" "rho0.001:sphere:0:reg.sphere.rho=0.001" "lossratio:sphere:1:reg.sphere.coef_mode=loss_ratio reg.sphere.rho=0.05" "rho0.001:sphere:1:reg.sphere.rho=0.001" &
wait
