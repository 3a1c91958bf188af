#!/usr/bin/env bash
# On the GPU machine (through `device`): the H200 measurements recorded in BENCHMARKS.md.
# Usage: bash scripts/gpu_measure.sh PHASE...   with PHASE one of
#   projection  C51 projection tests against the real kernel + benchmark + launch sweep (issue 5)
#   projvariants  the projection kernel against earlier ones saved as scripts/_<name>.py, a copy-only
#               kernel and the XLA scatter, kernel times, at 262,144 x 51 / 101 / 201 and 4,096 x 51;
#               then Nsight Compute on the kernel at 262,144 x 51 (registers, occupancy, throughput)
#   debug       the smoketest walk-forward with and without --debug, wall time each (issue 7)
#   determinism the same walk-forward twice (plain, then with XLA's deterministic GPU ops, then
#               that with --debug): are the numbers the same? (issue 7; DESIGN section 10)
#   coldcompile the same walk-forward in fresh processes with no compilation cache, twice each
#               with jdqn's XLA flags (none set: autotuning with jdqn's per-fusion autotune cache,
#               which the first run fills), autotuning on without a cache (level 4), autotuning
#               off and deterministic ops (COLD_VARIANTS picks some)
#   autotunecache  autotuning with a per-fusion results cache: reproducible across processes?
#   coldtrees   the main command cold (fresh cache each) for every tree in TREES (directories
#               holding `git archive <commit>` checkouts; default: this tree), after one warm-up
#               process (a machine's first process is slower), two rounds in rotated order
#   compiletimers  XLA's own compile timers (pass and backend times per program) of one cold
#               main command, summed per timer name
#   bench       `jdqn bench` without the projection section (issue 6); BENCH_ONLY narrows it
#   tailcompare the step's flat tail in XLA against the Pallas kernels at S = 1, 16, 128, 1,024
#               vmapped learners, alternated in one process (`jdqn.bench.seeds
#               --compare-update-impl`); then the flat-tail kernel tests on the real kernels
#   xlaflags    XLA flag sets against each other, in fresh processes sharing one autotune cache:
#               `jdqn.bench.seeds --seeds $XF_SEEDS` (default 1 1024) per entry of XF_SEED_VARIANTS
#               (default: default doublebuf), then the main command's worker (compilation cache off;
#               a first default process fills the autotune cache) per entry of XF_VARIANTS (default:
#               default doublebuf doublebuf default) with its compile, run and folds' sha256.
#               Flag sets: default (jdqn's), lhs and concurrent (XLA's command-buffer scheduling),
#               whilecmd (WHILE/CONDITIONAL command buffers too), doublebuf (XLA's while-loop
#               double buffering: two iterations per loop trip); fusionat, unrolltune, blocklevel,
#               heroless, alltriton, sameshape, tritonmof (XLA's experimental fusion options),
#               nodotmerge / dotmerge (dots that share an operand not merged, jdqn's default /
#               merged, XLA's default)
#   cmdbufmode  xlaflags with lhs against concurrent, A B B A ($CBM_MODES), seeds S = 1 .. 1,024
#   seedvariants  xlaflags' seeds part only: $SEED_VARIANTS (default: default whilecmd whilecmd
#               default) at $SEED_S (default 1 128 1024)
#   unroll      `jdqn.bench.seeds --compare-unroll 1 $UNROLL` (default 4) at $SEED_S (default
#               1 16 128 1024): steps per scan loop iteration, alternated A B B A in one process
#   longrun     the main command's worker at $LONG_EPOCHS epochs (default 50), with checkpoints
#               as configured and off: compile, run and orbax write seconds, folds' digest
#   timeline    the main command's phases in order: $TL_PROCESSES (default 4) worker processes
#               sharing a fresh cache (the first cold), each step's start and end against the
#               process's start (`python -m jdqn.bench.timeline --events`)
#   loads       a warm start's start-up by part (`python -m jdqn.bench.loads`): import jax, the
#               backend's start, each stored program's load, the other imports, in
#               $LOADS_PROCESSES (default 12) fresh processes taking the modes serial, thread
#               and backend in turn
#   fusedmlp    the MLP's forward and backward as one Pallas program per learner against XLA,
#               per call and per loop iteration (`python -m jdqn.bench.fused_mlp`)
#   criticalpath  the in-scan step's longest chain of dependent kernels and its kernel count, from
#               the compiled scan program (`python -m jdqn.bench.critical_path`), S = 1 and 1,024
#   kernels     per-kernel device profile of the in-scan step (`python -m jdqn.bench.kernels`)
#               at S = 1 under KERNEL_VARIANTS (default: XLA's command buffers as jdqn sets them,
#               and none) and at S = 1024 vmapped seeds under KERNEL_SEED_VARIANTS (default,
#               autotuning level 4, no command buffers); whilecmdbuf adds WHILE/CONDITIONAL;
#               an empty variable runs none of its list
# Logs go to $OUT (default ./gpu_logs). Each phase has its own time limit so one slow phase
# still leaves the others' logs.
set -uo pipefail
out="${OUT:-gpu_logs}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"  # absolute: some phases run from another tree
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$root"
# tensorboardX is not installed on the GPU image.
common=(--no-progress --set output.tensorboard=false --set output.compilation_cache=false)
folds() {  # sha256 of a run's fold results (the same numbers give the same digest)
  python3 -c 'import hashlib, json, pathlib, sys
paths = sorted(pathlib.Path(sys.argv[1]).rglob("results.json"))
folds = json.loads(paths[-1].read_text())["folds"] if paths else "none"
print(hashlib.sha256(json.dumps(folds, sort_keys=True).encode()).hexdigest()[:12])' "$1"
}
declare -A xflags=(
  [default]="" [lhs]=--xla_gpu_command_buffer_scheduling_mode=LHS
  [concurrent]=--xla_gpu_command_buffer_scheduling_mode=CONCURRENT
  [whilecmd]=--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL
  [doublebuf]=--xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_DOUBLE_BUFFER
  # Fusion emitters: the many-seed step's reductions over 51 atoms run far below bandwidth (Y1).
  [fusionat]=--xla_gpu_experimental_enable_fusion_autotuner=true
  [unrolltune]=--xla_gpu_native_emitter_tune_unroll_factor_for_loops=true
  [blocklevel]=--xla_gpu_experimental_enable_fusion_block_level_rewriter=true
  [heroless]=--xla_gpu_experimental_enable_triton_heroless_priority_fusion=true
  [alltriton]=--xla_gpu_experimental_all_fusions_with_triton=true
  [sameshape]=--xla_gpu_experimental_enable_same_shape_multi_output_fusion=true
  [tritonmof]=--xla_gpu_unsupported_enable_triton_multi_output_fusion=true
  # XLA merges dots that share an operand into one dot over concatenated operands (Y4: the
  # head's backward over 224 stacked cotangent rows, after a 72 us concatenation). jdqn turns
  # it off since Y5-Y6 (nodotmerge is then its default); dotmerge is XLA's own default.
  [nodotmerge]=--xla_gpu_dot_merger_threshold_mb=0
  [dotmerge]=--xla_gpu_dot_merger_threshold_mb=32
)
xla_flag_runs() {  # name, seeds' flag sets, seeds' S list, workers' flag sets (the first fills)
  local name="$1" seed_variants="$2" seed_s="$3" workers="$4" variant i=0 runs start
  local cache="$out/${name}_cache"
  {
    for variant in $seed_variants; do
      echo "== seeds, $variant: XLA_FLAGS=${xflags[$variant]}"
      JDQN_CACHE_DIR="$cache" XLA_FLAGS="${xflags[$variant]}" timeout "${XF_SEEDS_TIMEOUT:-150}" \
        python3 -m jdqn.bench.seeds --seeds $seed_s 2>&1 | grep -v -i deprecat
    done
    for variant in $workers; do
      i=$((i + 1)); runs="$out/${name}_runs/$i"
      start=$(date +%s%N)
      JDQN_CACHE_DIR="$cache" XLA_FLAGS="${xflags[$variant]}" timeout 150 python3 -m \
        jdqn.bench.walkforward_run --worker --set output.tensorboard=false \
        --set output.compilation_cache=false --set "output.out_dir=$runs" \
        > "$out/${name}_wf_$i.log" 2>&1
      echo "== main command $i, $variant: rc=$? wall_ms=$(( ($(date +%s%N) - start) / 1000000 ))" \
        "folds=$(folds "$runs")"
      grep -o '"walkforward_s": [0-9.]*\|"training_compile_s": [0-9.]*' \
        "$out/${name}_wf_$i.log" | tr '\n' ' '
      echo
    done
  } 2>&1 | tee "$out/$name.txt"
  rm -rf "$cache" "$out/${name}_runs" "$out/${name}"_wf_*.log
}
for phase in "$@"; do
  case "$phase" in
    projection)
      OUT="$out" timeout "${PROJECTION_TIMEOUT:-540}" bash scripts/gpu_projection_check.sh --tune --repeats 20 ;;
    projvariants)
      timeout -s KILL 240 python3 scripts/projection_variants.py 262144x51 262144x101 262144x201 \
        4096x51 2>&1 | grep -v -i deprecat | tee "$out/variants.log"
      # Without preallocation: ncu saves and restores the process's GPU memory on every replay.
      XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS=--xla_gpu_enable_command_buffer= \
        timeout -s KILL 150 ncu --clock-control none --kernel-name regex:c51_project \
        --launch-count 1 --section LaunchStats --section Occupancy --section SpeedOfLight \
        --section WarpStateStats --section ComputeWorkloadAnalysis \
        python3 scripts/projection_variants.py --ncu 262144x51 > "$out/ncu.txt" 2>&1
      grep -E "Duration|Registers Per|Occupancy|Throughput|Issued Warp" "$out/ncu.txt" ;;
    debug)
      for mode in off debug; do
        flag=(); [ "$mode" = debug ] && flag=(--debug)
        start=$(date +%s%N)
        timeout 150 python3 -m jdqn walkforward "${common[@]}" --out "$out/runs" --name "$mode" \
          "${flag[@]}" > "$out/debug_$mode.log" 2>&1
        rc=$?
        end=$(date +%s%N)
        echo "debug-overhead $mode rc=$rc wall_ms=$(( (end - start) / 1000000 ))" | tee -a "$out/debug.log"
        tail -3 "$out/debug_$mode.log"
      done
      rm -rf "$out/runs" ;;
    determinism)
      run() {  # name, extra args...: the fold table of one run
        local name=$1; shift
        timeout 150 python3 -m jdqn walkforward --no-progress --set output.tensorboard=false \
          --out "$out/det" --name "$name" "$@" > "$out/det_$name.log" 2>&1
        echo "== $name rc=$?"; grep -E '^ +[0-9]+ +[0-9]+ ' "$out/det_$name.log"
      }
      {
        run plain_1; run plain_2
        XLA_FLAGS=--xla_gpu_deterministic_ops=true run det_1
        XLA_FLAGS=--xla_gpu_deterministic_ops=true run det_2
        XLA_FLAGS=--xla_gpu_deterministic_ops=true run det_debug --debug
      } 2>&1 | tee "$out/determinism.txt"
      rm -rf "$out/det" "$out"/det_*.log ;;
    coldcompile)
      cold() {  # name, extra args...: the fold table of one run, compiled from scratch
        local name=$1; shift
        timeout 100 python3 -m jdqn walkforward "${common[@]}" --out "$out/cold" --name "$name" \
          "$@" > "$out/cold_$name.log" 2>&1
        echo "== $name rc=$?"; grep -E '^ +[0-9]+ +[0-9]+ ' "$out/cold_$name.log"
      }
      declare -A flags=(
        [jdqn]="" [autotune4]=--xla_gpu_autotune_level=4 [autotune0]=--xla_gpu_autotune_level=0
        [detops]=--xla_gpu_deterministic_ops=true
      )
      for variant in ${COLD_VARIANTS:-jdqn autotune4 autotune0 detops}; do
        for i in 1 2; do
          XLA_FLAGS="${flags[$variant]}" cold "${variant}_$i"
        done
      done 2>&1 | tee "$out/coldcompile.txt"
      rm -rf "$out/cold" "$out"/cold_*.log ;;
    bench)
      only=()
      for section in ${BENCH_ONLY:-learner_step seeds walkforward breakdown kernels torch_peer replay}; do
        only+=(--only "$section")
      done
      timeout "${BENCH_TIMEOUT:-420}" python3 -m jdqn bench "${only[@]}" --json "$out/bench.json" \
        2>&1 | tee "$out/bench.log" ;;
    tailcompare)
      {
        timeout "${TAIL_TIMEOUT:-400}" python3 -m jdqn.bench.seeds --compare-update-impl 2>&1 \
          | grep -v -i deprecat
        JAX_PLATFORMS=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider \
          tests/test_flat_tail.py tests/test_learner.py -k "fused or guard or adam or gram or vmap" \
          2>&1 | tail -3
      } 2>&1 | tee "$out/tailcompare.txt" ;;
    unroll)
      # shellcheck disable=SC2086  # SEED_S is a list of S
      timeout "${UNROLL_TIMEOUT:-400}" python3 -m jdqn.bench.seeds --compare-unroll 1 \
        "${UNROLL:-4}" --seeds ${SEED_S:-1 16 128 1024} 2>&1 | grep -v -i deprecat \
        | tee "$out/unroll.txt" ;;
    longrun)
      # The main command's worker at $LONG_EPOCHS epochs (default 50), alternating jdqn's outputs
      # as configured and checkpoints off, sharing one autotune cache (compilation cache off; the
      # first process fills the autotune cache): compile and run seconds, orbax's write time.
      export JDQN_CACHE_DIR="$out/lr_cache"
      {
        i=0
        # LONG_VARIANTS: default (this tree), nockpt (checkpoints off), before (the tree in
        # $BEFORE_TREE, a `git archive` checkout of an earlier commit).
        for variant in ${LONG_VARIANTS:-default default nockpt default nockpt}; do
          i=$((i + 1)); runs="$out/lr_runs/$i"
          extra=(); [ "$variant" = nockpt ] && extra=(--set output.checkpoints=false)
          tree="$root"; [ "$variant" = before ] && tree="$(cd "$BEFORE_TREE" && pwd)"
          (cd "$tree" && PYTHONPATH="$tree" timeout 150 python3 -m jdqn.bench.walkforward_run --worker \
            --set output.tensorboard=false --set output.compilation_cache=false \
            --set "train.epochs=${LONG_EPOCHS:-50}" "${extra[@]}" \
            --set "output.out_dir=$runs") > "$out/lr_wf_$i.log" 2>&1
          echo "== worker $i, $variant: rc=$? folds=$(folds "$runs")" "$(grep -o \
            '"walkforward_s": [0-9.]*\|"training_compile_s": [0-9.]*\|"run_s": [0-9.]*\|orbax/write/total_duration_secs": [0-9.]*' \
            "$out/lr_wf_$i.log" | tr '\n' ' ')"
        done
      } 2>&1 | tee "$out/longrun.txt"
      rm -rf "$out/lr_cache" "$out/lr_runs" ;;
    xlaflags)
      xla_flag_runs xlaflags "${XF_SEED_VARIANTS:-default doublebuf}" "${XF_SEEDS:-1 1024}" \
        "default ${XF_VARIANTS:-default doublebuf doublebuf default}" ;;
    cmdbufmode)
      modes="${CBM_MODES:-lhs concurrent concurrent lhs}"
      xla_flag_runs cmdbufmode "$modes" "1 16 128 1024" "lhs $modes" ;;
    seedvariants)
      xla_flag_runs seedvariants "${SEED_VARIANTS:-default whilecmd whilecmd default}" \
        "${SEED_S:-1 128 1024}" "" ;;
    timeline)
      timeout "${TL_TIMEOUT:-300}" python3 -m jdqn.bench.timeline --processes "${TL_PROCESSES:-4}" \
        --events --set output.tensorboard=false 2>&1 | tee "$out/timeline.txt" ;;
    loads)
      timeout "${LOADS_TIMEOUT:-300}" python3 -m jdqn.bench.loads --processes \
        "${LOADS_PROCESSES:-12}" --set output.tensorboard=false 2>&1 | tee "$out/loads.txt" ;;
    criticalpath)
      for s in 1 1024; do
        timeout 300 python3 -m jdqn.bench.critical_path --seeds "$s" 2>&1 | tee "$out/critical_path_s$s.txt"
      done ;;
    fusedmlp)
      timeout "${FUSED_TIMEOUT:-300}" python3 -m jdqn.bench.fused_mlp 2>&1 | tee "$out/fused_mlp.txt" ;;
    kernels)
      declare -A kflags=(
        [default]="" [nocmdbuf]=--xla_gpu_enable_command_buffer=
        [whilecmdbuf]=--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL
        [autotune4]=--xla_gpu_autotune_level=4
        [autotune4_nocmdbuf]="--xla_gpu_autotune_level=4 --xla_gpu_enable_command_buffer="
        [notriton]=--xla_gpu_enable_triton_gemm=false
        [notriton_nocmdbuf]="--xla_gpu_enable_triton_gemm=false --xla_gpu_enable_command_buffer="
      )
      profile() {  # variant, seeds, steps
        echo "== $1, S=$2: XLA_FLAGS=${kflags[$1]}"
        XLA_FLAGS="${kflags[$1]}" timeout 150 python3 -m jdqn.bench.kernels --seeds "$2" \
          --steps "$3" --top "${KERNEL_TOP:-40}" --json "$out/kernels_${1}_s$2.json" 2>&1 | tail -$(( ${KERNEL_TOP:-40} + 30 ))
      }
      {
        for variant in ${KERNEL_VARIANTS-default nocmdbuf}; do profile "$variant" 1 500; done
        for variant in ${KERNEL_SEED_VARIANTS-default autotune4 nocmdbuf}; do
          profile "$variant" 1024 50
        done
      } 2>&1 | tee "$out/kernels.txt" ;;
    autotunecache)
      # Autotuning on, its results kept in a per-fusion cache: do processes sharing the cache
      # agree bit for bit (A, B), does a fresh cache (C), and how fast are many seeds with it?
      cache="$out/autotune_cache"
      cachedflags() {
        mkdir -p "$1"; echo "--xla_gpu_autotune_level=4 --xla_gpu_per_fusion_autotune_cache_dir=$1"
      }
      cached() {  # name, cache dir: the fold table of one walk-forward run
        local start=$(date +%s%N)
        XLA_FLAGS="$(cachedflags "$2")" timeout 120 python3 -m jdqn walkforward "${common[@]}" \
          --out "$out/at" --name "$1" > "$out/at_$1.log" 2>&1
        echo "== $1 rc=$? wall_ms=$(( ($(date +%s%N) - start) / 1000000 ))"
        grep -E '^ +[0-9]+ +[0-9]+ ' "$out/at_$1.log"
      }
      {
        cached A "$cache/shared"; echo "cache files: $(find "$cache" -type f | wc -l)"
        cached B "$cache/shared"; cached C "$cache/fresh"
        XLA_FLAGS="$(cachedflags "$cache/shared")" timeout 150 python3 -m jdqn.bench.kernels \
          --seeds 1024 --steps 50 --top 5 2>&1 | grep -E '^wall'
      } 2>&1 | tee "$out/autotunecache.txt"
      rm -rf "$out/at" "$cache" ;;
    coldtrees)
      worker() {  # label, tree: one cold run in a fresh cache; wall, compile and program times
        local start=$(date +%s%N)
        (cd "$2" && JDQN_CACHE_DIR="$out/ct_cache_$1" PYTHONPATH="$2" timeout 150 python3 -m \
          jdqn.bench.walkforward_run --worker --set output.tensorboard=false \
          --set "output.out_dir=$out/ct_runs/$1" > "$out/ct_$1.log" 2>&1)
        echo "== $1 ($2) rc=$? wall_ms=$(( ($(date +%s%N) - start) / 1000000 ))"
        grep -o '"walkforward_s": [0-9.]*\|"training_compile_s": [0-9.]*' "$out/ct_$1.log" | tr '\n' ' '
        echo
      }
      trees=(${TREES:-$root}); n=${#trees[@]}
      {
        worker warmup "${trees[0]}"
        for i in "${!trees[@]}"; do worker "r1_t$i" "${trees[$i]}"; done
        for ((i = n - 1; i >= 0; i--)); do worker "r2_t$i" "${trees[$i]}"; done
      } 2>&1 | tee "$out/coldtrees.txt"
      rm -rf "$out"/ct_cache_* "$out/ct_runs" ;;
    compiletimers)
      JDQN_CACHE_DIR="$out/timers_cache" TF_CPP_MIN_LOG_LEVEL=0 \
        TF_CPP_VMODULE=gpu_compiler=1,nvptx_compiler=1,hlo_pass_pipeline=1,compile_module_to_llvm_ir=1 \
        timeout 150 python3 -m jdqn.bench.walkforward_run --worker --set output.tensorboard=false \
        --set "output.out_dir=$out/timers_runs" > "$out/timers.log" 2>&1
      python3 - "$out/timers.log" <<'PY' | tee "$out/compiletimers.txt"
import collections, re, sys
seconds = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
total, count = collections.defaultdict(float), collections.Counter()
for line in open(sys.argv[1]):
    m = re.search(r"\] (.*?) time: ([0-9.]+) (s|ms|us) ", line)
    if m:
        name = re.sub(r"\.\d+", ".#", m.group(1))
        total[name] += float(m.group(2)) * seconds[m.group(3)]
        count[name] += 1
for name, s in sorted(total.items(), key=lambda kv: -kv[1])[:40]:
    print(f"{s:8.3f} s {count[name]:5d}  {name}")
PY
      rm -rf "$out/timers_cache" "$out/timers_runs" "$out/timers.log" ;;
    *) echo "unknown phase: $phase" >&2; exit 2 ;;
  esac
done
