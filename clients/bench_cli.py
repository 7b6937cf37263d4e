"""`simulserve bench engine|step|peer|server|abuse`: benchmarks that print their figures (never asserted in tests)."""
from __future__ import annotations

import argparse
import json

from models.decoding import add_decoding_arguments, decoding_options

# everyday German: the everyday set (260 lines), then the dialogue set (games' conversations)
PEER_SOURCE = "data/de-en-everyday/test.everyday.de,data/de-en-everyday/test.dialogue.de"
DEVICE_HELP = "auto (default: cuda when available, else cpu), cpu, cuda, cuda:N"


def register(sub) -> None:
    p = sub.add_parser(
        "bench", help="benchmarks: the streaming engine, the step, or a running server",
        description="Benchmarks that print their figures: the engine against a naive baseline, the step with "
                    "and without its fast paths, a server under simulated speakers.",
        epilog="examples:\n"
               "  simulserve bench engine -m gma_delta1 --count 3\n"
               "  simulserve bench step --gemm\n"
               "  simulserve bench peer --sentences 500\n"
               "  simulserve bench server --checkpoint gma_delta1 --levels 1,10,25 --skip soak",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_subparsers(dest="bench", metavar="WHAT")
    e = which.add_parser(
        "engine", help="streaming step vs a naive re-computing baseline",
        description="Per-sentence compute of the streaming step against a naive baseline that re-computes "
                    "the whole prefix, checking both write the same tokens.",
        epilog="example:\n  simulserve bench engine -m gma_delta1 --count 3 --lengths 10,30,100",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--checkpoint", "-m", action="append",
                   help="checkpoint dir or shipped name (repeatable; default: every shipped model)")
    e.add_argument("--source", help="text to cut sentences from (default: data/de-en/test.de)")
    e.add_argument("--lengths", default="10,30,100", help="source lengths in words")
    e.add_argument("--count", type=int, default=5, help="sentences per length")
    e.add_argument("--k", type=int)
    e.add_argument("--delta", type=float)
    e.add_argument("--threads", type=int, default=1, help="torch threads (1: per-stream cost; CPU only)")
    e.add_argument("--device", default="auto", help=DEVICE_HELP)
    e.add_argument("--json", help="also write the rows here")
    add_decoding_arguments(e)
    e.set_defaults(func=run_engine)
    st = which.add_parser(
        "step", help="the streaming step with its fast paths vs without, per batch size",
        description="Milliseconds per written token of the streaming step with and without its fast paths, "
                    "per batch size; then the step's wall time against its kernel time (the host overhead) "
                    "and its host<->device traffic.",
        epilog="examples:\n  simulserve bench step --gemm\n  simulserve bench step --dtype bfloat16\n"
               "  simulserve bench step --device cuda --batch-sizes 1,8,32,128 --sentences 128\n"
               "  simulserve bench step --paths host,sync-free,compiled --batch-sizes 1,8\n\n"
               "host overhead table (one profiled round per batch size, besides --rounds un-profiled ones; it\n"
               "covers at most 64 sentences, or one batch, where --sentences is larger):\n"
               "  step wall ms    perf_counter around each StreamingDecoder.step of the un-profiled rounds\n"
               "                  (CUDA: synchronised before the clock stops), mean per step, median of rounds\n"
               "  kernel ms/step  CUDA: time of every GPU activity (kernels, memcpy, memset) / steps;\n"
               "                  CPU: self time of the innermost compute operators / steps: every aten::/\n"
               "                  mkldnn:: operator except reads (item, _local_scalar_dense, nonzero), copies\n"
               "                  and conversions (to, _to_copy, copy_, clone, contiguous), indexing (index*),\n"
               "                  tensor creation (empty*, zeros*, ones*, full*, arange, lift_fresh, fill_,\n"
               "                  zero_), views (view, reshape, select, slice, transpose, ...) and dropout,\n"
               "                  not called by one of those, calling no other compute operator\n"
               "  encoding steps  the share of steps that ran the encoder (see --arrivals)\n"
               "  decoder rows/step  streams in a step's decoder trial, mean over the steps: the batch a step\n"
               "                  really runs (the batch size caps it: streams waiting for words sit steps out)\n"
               "  outside graphs ms/step (graph forms)  the step's time outside its graphs: on the CPU the\n"
               "                  wall less the replayed graphs' eager bodies, i.e. the host work (planning,\n"
               "                  uploads, copies, results) a GPU run pays as well; on CUDA the wall less the\n"
               "                  graph span\n"
               "  wall/kernel     the host's share (1 = nothing but kernels)\n"
               "  operators/step  aten:: operators the step's Python code dispatched (none enclosing\n"
               "                  them): host time each, a kernel launch each on a GPU unless graphed\n"
               "  uploads/step    aten::lift_fresh events: tensors made from Python values (a host->device\n"
               "                  copy on a GPU)\n"
               "  reads/step      aten::_local_scalar_dense + aten::nonzero events + Tensor.tolist/numpy/cpu\n"
               "                  calls: device->host reads the host waits for on a GPU\n"
               "  launches/step (CUDA only)  cudaLaunchKernel(ExC), cuLaunchKernel(Ex) and cudaGraphLaunch calls\n"
               "  memcpy/step, syncs/step (CUDA only)  Memcpy HtoD/DtoH activities and\n"
               "                  cudaStreamSynchronize/cudaDeviceSynchronize/cudaEventSynchronize calls\n"
               "  device activities/step (CUDA only)  kernels, copies and memsets of the profiled round per\n"
               "                  step (each kernel of a graph counts)\n"
               "  graph span ms/step (CUDA, graph forms)  device time from each replay's start to its end\n"
               "                  (CUDA events, one more unprofiled round), gaps between a graph's kernels\n"
               "                  included: above kernel ms/step, the device spends the difference, not the host\n"
               "  device idle before / between / after ms (CUDA only)  per step of the profiled round, the\n"
               "                  time the device did nothing before its first activity (host planning and\n"
               "                  launching), between its activities (gaps inside and between graphs and\n"
               "                  copies) and after its last (the read back, the results); the profiler slows\n"
               "                  the host, so before and after read larger than in the timed rounds\n"
               "  host Python / graph launches / waits ms (CUDA, graph forms)  the timed rounds' step wall\n"
               "                  split by the host's clock: time inside graph.replay() calls (launches),\n"
               "                  blocked until the device is done (the read back's event, the clock's\n"
               "                  synchronize: waits), and the rest (host Python: checks, planning, uploads\n"
               "                  queued, results); the median round's, the three add up to its wall",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    st.add_argument("--checkpoint", "-m", default="gma_delta1", help="checkpoint dir or shipped name")
    st.add_argument("--source", help="sentences, one per line (default: data/de-en/test.de)")
    st.add_argument("--batch-sizes", default="1,8,32", help="streams stepped together")
    st.add_argument("--sentences", type=int, default=32, help="the first N source lines of 1-30 words")
    st.add_argument("--rounds", type=int, default=3,
                    help="timed rounds (fast and plain alternate; the host-overhead table's are separate, "
                         "plus one profiled round); medians are reported")
    st.add_argument("--threads", type=int, default=1, help="torch threads (CPU only)")
    st.add_argument("--device", default="auto", help=DEVICE_HELP)
    st.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16 (CUDA only)")
    st.add_argument("--paths", default="default",
                    help="step forms for the host overhead table, comma-separated: default (what translate "
                         "runs here), host (CPU shortcuts), sync-free (the GPU form), static (sync-free, padded "
                         "shapes), compiled (static + torch.compile; CUDA graphs on CUDA), graphs, "
                         "graphs-encoder, graphs-fused (CUDA graphs captured at start-up), int8 (int8 weights, "
                         "CPU), int8-gemv (int8, a lone row in one call), gemv (a lone row by BLAS gemv), plain "
                         "(no fast path); models/step_form.py. Default: default")
    st.add_argument("--arrivals", choices=("lockstep", "staggered", "overlapped"), default="lockstep",
                    help="how words reach the streams of the host overhead table: lockstep (default: batches "
                         "of sentences, every waiting stream's next word at once, so a round's first step "
                         "encodes and the others only write), staggered (as many streams as the batch size, "
                         "each one word every 4 steps, out of phase, as in a server: most steps encode) or "
                         "overlapped (two lockstep groups of the batch size, one's step launched before the "
                         "other's is collected, as the server's jobs on a GPU: step wall is the time in their launch "
                         "and collect calls over the steps, one group's host work hidden behind the other's "
                         "kernels; give at least twice the batch size in --sentences)")
    st.add_argument("--host-only", action="store_true",
                    help="the host overhead table alone: no fast-against-plain table before it and no --step auto "
                         "timing after it (a GPU check's extra parts, within their budgets)")
    st.add_argument("--gemm", action="store_true",
                    help="also: GFLOP/s of single linears on the CPU (the matrix units' rate) in float32 and "
                         "bfloat16")
    st.add_argument("--json", help="also write the rows here")
    add_decoding_arguments(st)
    st.set_defaults(func=run_step)
    pe = which.add_parser(
        "peer", help="offline decoding side by side with CTranslate2 (the [peer] extra)",
        description="The checkpoint converted to CTranslate2 (simulserve convert-ctranslate2) and the project's "
                    "offline decoding translate the same sentences whole, greedy, in one run: target tokens/s "
                    "(EOS included) per batch size and precision, and outputs identical token for token. "
                    "One torch thread and CTranslate2 intra_threads=1 unless --threads says otherwise.",
        epilog="examples:\n  simulserve bench peer --sentences 500\n"
               "  simulserve bench peer --source data/de-en-everyday/test.dialogue.de --batch-sizes 1,8,32",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    pe.add_argument("--checkpoint", "-m", default="offline", help="checkpoint dir or shipped name (an offline model)")
    pe.add_argument("--source", default=PEER_SOURCE,
                    help="sentences, one per line; several files comma-separated, read in order "
                         f"(default {PEER_SOURCE})")
    pe.add_argument("--sentences", type=int, default=500, help="the first N lines (default 500)")
    pe.add_argument("--batch-sizes", default="1,32", help="sentences decoded together (default 1,32)")
    pe.add_argument("--precisions", default="float32,int8",
                    help="float32 and/or int8 (CTranslate2's compute type; the project's step form, where it "
                         "has one for that precision)")
    pe.add_argument("--rounds", type=int, default=1, help="timed rounds, the two engines alternating; medians")
    pe.add_argument("--threads", type=int, default=1, help="torch threads and CTranslate2 intra_threads")
    pe.add_argument("--ct2-dir", help="keep the converted CTranslate2 model here (default: a temporary directory)")
    pe.add_argument("--profile", action="store_true",
                    help="also: one profiled run of the project's side per row (the first max(16, 2 x batch) "
                         "sentences), its operator groups' shares of the operators' CPU time")
    pe.add_argument("--json", help="also write the rows here")
    pe.set_defaults(func=run_peer)
    try:
        from server.bench import add_server_bench_args, run_server_bench
    except ImportError:
        return
    s = which.add_parser(
        "server", help="simulated speakers against a running server",
        description="Simulated speakers against a server (started here, or --url): a real-time ramp, "
                    "batched vs unbatched throughput and a memory soak.",
        epilog="examples:\n"
               "  simulserve bench server --checkpoint gma_delta1 --levels 1,10,25,50 --real-time-on live "
               "--skip soak\n"
               "  simulserve bench server --checkpoint gma_delta1 --skip ramp,throughput --soak-seconds 600",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_bench_args(s)
    s.set_defaults(func=run_server_bench)
    from server.bench_abuse import add_abuse_bench_args, run_abuse_bench
    a = which.add_parser(
        "abuse", help="a bounded mix of attacks while honest streams run (issue 15)",
        description="A fixed, bounded mix of hostile and careless clients against a server started here, while "
                    "honest streams run: prints honest sentences identical, words lost or duplicated, /health "
                    "failures, RSS growth after the attack and every error type seen.",
        epilog="examples:\n"
               "  simulserve bench abuse --checkpoint waitk --rounds 2 --settle 60\n"
               "  simulserve bench abuse --soak-streams 0 --json abuse.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_abuse_bench_args(a)
    a.set_defaults(func=run_abuse_bench)


def _source_lines(path: str | None) -> list[str]:
    from models.errors import UserError
    path = path or "data/de-en/test.de"
    try:
        return open(path, encoding="utf-8").read().splitlines()
    except FileNotFoundError:
        raise UserError(f"{path} not found: pass --source FILE (any German text)") from None


def _sizes(text: str, flag: str) -> list[int]:
    from models.errors import UserError
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise UserError(f"{flag} takes positive integers separated by commas, got {text!r}")
    return sizes


def _load(name: str, device_name: str, dtype_name: str | None = None):
    """(model, tokenizer, device) on the device asked for (auto: CUDA when available)."""
    from models.checkpoint import load_checkpoint, pick_device, pick_dtype
    from models.shipped import resolve_checkpoint
    device = pick_device(device_name)
    model, tok, _ = load_checkpoint(resolve_checkpoint(name), device, pick_dtype(dtype_name, device))
    return model, tok, device


def _paths(text: str) -> list[str]:
    from models.step_form import FORMS
    from models.errors import UserError
    paths = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in paths if p not in FORMS]
    if bad or not paths:
        raise UserError(f"--paths: unknown step form(s) {', '.join(bad) or '(none given)'}; "
                        f"choose from {', '.join(FORMS)}")
    return paths


def _machine(device) -> str:
    """The line every benchmark table is printed under: the CPU class decides which form is fast."""
    from models.cpu_info import cpu_summary
    import torch
    line = f"CPU: {cpu_summary()['line']}; torch {torch.__version__}"
    if device.type == "cuda":
        line += f"; GPU: {torch.cuda.get_device_name(device)}"
    return line


def host_overhead_row(r: dict, cuda: bool) -> str:
    """One row of bench step's host-overhead table (models/benchmarks/host_overhead.py's keys)."""
    idle = (" / ".join(f"{r[f'device_{part}_ms']:.3f}" for part in ("idle_before", "idle_between", "idle_after"))
            if "device_idle_before_ms" in r else "n/a")
    span = f"{r['graph_span_ms_per_step']:.3f}" if "graph_span_ms_per_step" in r else "n/a"
    activities = f"{r['activities_per_step']:.0f}" if "activities_per_step" in r else "n/a"
    split = (" / ".join(f"{r[k]:.3f}" for k in ("host_python_ms_per_step", "graph_launch_ms_per_step",
                                                "wait_ms_per_step"))
             if "host_python_ms_per_step" in r else "n/a")
    extra = (f"{r['launches_per_step']:.1f} | {r['memcpy_per_step']:.1f} | {r['syncs_per_step']:.1f} | "
             f"{activities} | {span} | {idle} | {split} | " if cuda else "")
    ratio = "n/a" if r["wall_over_kernel"] is None else f"{r['wall_over_kernel']:.2f}x"
    outside = f"{r['outside_graphs_ms_per_step']:.3f}" if "outside_graphs_ms_per_step" in r else "n/a"
    rows = f"{r['decoder_rows_per_step']:.1f}" if "decoder_rows_per_step" in r else "n/a"   # (older reports: none)
    return (f"| {r['path']} | {r['batch_size']} | {r['steps']} | {100 * r['encoding_share']:.0f}% | "
            f"{r['step_wall_ms']:.2f} | {r['kernel_ms_per_step']:.3f} | "
            f"{r['step_wall_ms'] - r['kernel_ms_per_step']:.3f} | {outside} | {ratio} | "
            f"{r['operators_per_step']:.0f} | {r['uploads_per_step']:.1f} | {r['reads_per_step']:.1f} | "
            f"{extra}{rows} | {'yes' if r['identical'] else 'NO'} | "
            f"{'yes' if r['same_as_first'] else 'NO'} |")


def run_step(args) -> int:
    import torch
    from tqdm import tqdm

    from models.benchmarks.engine import bench_fast_paths
    from models.benchmarks.host_overhead import bench_host_overhead
    torch.set_num_threads(args.threads)   # CPU only; a GPU run keeps it for the host side
    sizes = _sizes(args.batch_sizes, "--batch-sizes")
    model, tok, device = _load(args.checkpoint, args.device, args.dtype)
    lines = _source_lines(args.source)
    where = f"{device}, {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "cpu"
    options = decoding_options(args)
    rows = []
    if not args.host_only:
        with tqdm(total=len(sizes) * args.rounds * 2, desc="fast vs plain", unit="run") as bar:
            rows = bench_fast_paths(model, tok, lines, sizes, args.sentences, args.rounds, progress=bar,
                                    options=options)
    paths = _paths(args.paths)
    with tqdm(total=len(paths) * len(sizes) * (args.rounds + 1), desc="host overhead", unit="run") as bar:
        host = bench_host_overhead(model, tok, lines, sizes, args.sentences, args.rounds, progress=bar,
                                   paths=paths, options=options, arrivals=args.arrivals)
    choice = None
    if device.type == "cpu" and not args.host_only:   # what `--step auto` would choose here, timed afresh
        from models.step_choice import StepChoice, measure, pick
        timings = measure(model, tok, options)
        choice = StepChoice(*pick(timings), timings)
    rules = options.for_policy(model.cfg.policy)
    print(f"\n{_machine(device)}")
    print(f"{args.checkpoint} ({model.cfg.policy}, {where}, {args.dtype}, {args.threads} thread(s), "
          f"no_stutter {rules.no_stutter}, no_repeat_ngram {rules.no_repeat_ngram}), "
          f"{host[0]['sentences']} sentences word by word, median of {args.rounds} alternating rounds")
    if rows:
        print("| batch size | target tokens | fast ms/token | plain ms/token | speed-up | identical |")
        print("|---:|---:|---:|---:|---:|:---:|")
    for r in rows:
        print(f"| {r['batch_size']} | {r['target_tokens']} | {r['fast_ms_per_token']:.2f} | "
              f"{r['plain_ms_per_token']:.2f} | {r['speedup']:.2f}x | {'yes' if r['identical'] else 'NO'} |")
    cuda = device.type == "cuda"
    print(f"\nhost overhead of the fast step, {args.arrivals} arrivals: wall time (median of {args.rounds} rounds) "
          "against kernel time "
          f"({'GPU activities' if cuda else 'CPU compute operators'}, one profiled round); "
          "`simulserve bench step -h` defines each column")
    print("| step | batch size | steps | encoding steps | step wall ms | kernel ms/step | host ms/step | "
          "outside graphs ms/step | wall/kernel | operators/step | uploads/step | reads/step | "
          + ("launches/step | memcpy/step | syncs/step | device activities/step | graph span ms/step | "
             "device idle before / between / after ms | host Python / graph launches / waits ms | " if cuda else "")
          + "decoder rows/step | identical | same as first |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
          + ("---:|---:|---:|---:|---:|---:|---:|" if cuda else "") + "---:|:---:|:---:|")
    for r in host:
        print(host_overhead_row(r, cuda))
    if choice is not None:
        print(f"\n--step auto here: {choice.reason}; ms per step while streams translate a sentence word by "
              "word (median of 5 rounds, models/step_choice.py)")
        print(choice.table())
    out = {"device": str(device), "dtype": args.dtype, "machine": _machine(device), "step": rows,
           "arrivals": args.arrivals, "host_overhead": host, "auto": choice.describe() if choice else None}
    if args.gemm:
        from models.benchmarks.engine import gemm_rates
        out["gemm"] = gemm_rates()
        print(f"\nsingle linears on the CPU, weight in cache, {args.threads} thread(s)")
        print("| dtype | packed | out × in | batch | µs | GFLOP/s |")
        print("|---|:---:|---|---:|---:|---:|")
        for r in out["gemm"]:
            print(f"| {r['dtype']} | {'yes' if r['packed'] else 'no'} | {r['shape'][0]} × {r['shape'][1]} | "
                  f"{r['batch']} | {r['us']:.1f} | {r['gflops']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def run_peer(args) -> int:
    import torch
    from tqdm import tqdm

    from models.benchmarks.peer import NO_PATH, PROJECT_FORMS, bench_peer, int8_speedups
    from models.ctranslate2_peer import COMPUTE_TYPES, import_ctranslate2
    from models.errors import UserError
    ct2 = import_ctranslate2()
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    bad = [p for p in precisions if p not in COMPUTE_TYPES]
    if bad or not precisions:
        raise UserError(f"--precisions: choose from {', '.join(COMPUTE_TYPES)}, got {args.precisions!r}")
    if args.rounds < 1 or args.threads < 1 or args.sentences < 1:
        raise UserError("--rounds, --threads and --sentences must be at least 1")
    sizes = _sizes(args.batch_sizes, "--batch-sizes")
    lines = [x for path in args.source.split(",") for x in _source_lines(path) if x.strip()][: args.sentences]
    torch.set_num_threads(args.threads)
    with tqdm(total=len(precisions) * len(sizes) * args.rounds, desc="simulserve vs CTranslate2", unit="run") as bar:
        rows = bench_peer(args.checkpoint, lines, sizes, precisions, args.rounds, args.ct2_dir, args.threads,
                          progress=bar, profile=args.profile)
    print(f"\n{_machine(torch.device('cpu'))}")
    print(f"{args.checkpoint}: the first {len(lines)} sentences of {args.source}, whole sentence, greedy; "
          f"{args.threads} thread(s) (torch, CTranslate2 {ct2.__version__} intra_threads); target tokens (EOS "
          f"included) per CPU second of the process, per wall second in brackets; median of {args.rounds} round(s)")
    print("| precision | batch | simulserve tokens/s | CTranslate2 tokens/s | CTranslate2 / simulserve | goal | "
          "identical (same precision) | identical to simulserve float32 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    n = len(lines)
    for r in rows:
        ours = (NO_PATH if r["simulserve_tokens_per_s"] is None else
                f"{r['simulserve_tokens_per_cpu_s']:.0f} ({r['simulserve_tokens_per_s']:.0f})")
        theirs = f"{r['ctranslate2_tokens_per_cpu_s']:.0f} ({r['ctranslate2_tokens_per_s']:.0f})"
        ratio = "n/a" if r["ctranslate2_over_simulserve"] is None else \
            f"{r['ctranslate2_over_simulserve']:.2f}x ({r['ctranslate2_over_simulserve_wall']:.2f}x)"
        goal = "" if r["goal"] is None else f"<= {r['goal']:g}x"
        if r["goal"] is not None and r["ctranslate2_over_simulserve"] is not None:
            goal += " met" if r["ctranslate2_over_simulserve"] <= r["goal"] else " MISSED"
        same = "n/a" if r["identical"] is None else f"{r['identical']}/{n}"
        ref = "n/a" if r["identical_to_float32"] is None else f"{r['identical_to_float32']}/{n}"
        print(f"| {r['precision']} | {r['batch_size']} | {ours} | {theirs} | {ratio} | {goal} | {same} | {ref} |")
    speedups = int8_speedups(rows)
    if speedups:   # the CPU issue's "int8 >= 2x float32 in one run": the precisions take turns within each round
        print("\nint8 over float32 in this run (tokens per CPU second): " + "; ".join(
            f"batch {b}: simulserve {'n/a' if ours is None else f'{ours:.2f}x'}, CTranslate2 {theirs:.2f}x"
            for b, ours, theirs in speedups))
    print("\nlinear layers of the run (the same work in both engines; attention products left out), GFLOP and "
          "GFLOP per CPU second")
    print("| precision | batch | GFLOP | simulserve GFLOP/s | CTranslate2 GFLOP/s |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        rate = r["simulserve_linear_gflop_per_cpu_s"]
        ours = "n/a" if rate is None else f"{rate:.1f}"
        print(f"| {r['precision']} | {r['batch_size']} | {r['ctranslate2_linear_gflop']:.1f} | {ours} | "
              f"{r['ctranslate2_linear_gflop_per_cpu_s']:.1f} |")
    if args.profile:
        print("\nthe project's side, one profiled run per row on the first max(16, 2 x batch) sentences: share of "
              "the operators' own CPU time")
        groups = list(next(r["simulserve_profile"] for r in rows if "simulserve_profile" in r)) if any(
            "simulserve_profile" in r for r in rows) else []
        print("| precision | batch | " + " | ".join(groups) + " |")
        print("|---|---:|" + "---:|" * len(groups))
        for r in rows:
            if "simulserve_profile" in r:
                print(f"| {r['precision']} | {r['batch_size']} | "
                      + " | ".join(f"{100 * r['simulserve_profile'][g]:.0f}%" for g in groups) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"checkpoint": str(args.checkpoint), "source": args.source, "threads": args.threads,
                       "ctranslate2": ct2.__version__, "project_forms": [p for p, f in PROJECT_FORMS.items() if f],
                       "rows": rows}, f, indent=1)
    # float32 outputs must match: anything else is a bug in one model code or the converter
    return 0 if all(r["identical"] in (None, n) for r in rows if r["precision"] == "float32") else 1


def run_engine(args) -> int:
    import torch
    from tqdm import tqdm

    from models.benchmarks.engine import bench_engine
    from models.checkpoint import pick_device
    from models.errors import UserError
    from models.policies import policy_class
    from models.shipped import shipped_checkpoints
    from models.step import StreamingDecoder
    torch.set_num_threads(args.threads)
    names = args.checkpoint or list(shipped_checkpoints())
    if not names:
        raise UserError("no shipped models: pass --checkpoint DIR")
    lines = _source_lines(args.source)
    lengths = _sizes(args.lengths, "--lengths")
    pick_device(args.device)   # a bad --device fails before any model loads
    all_rows = []
    for name in names:
        model, tok, device = _load(name, args.device)
        dec = StreamingDecoder(model, tok, options=decoding_options(args))
        rule = policy_class(model.cfg)
        k = args.k if rule.has_k else None
        delta = args.delta if rule.has_delta else None
        with tqdm(total=len(lengths) * args.count, desc=str(name), unit="sent") as bar:
            rows = bench_engine(dec, lines, lengths, args.count, k=k, delta=delta, progress=bar)
        print(f"\n{_machine(device)}")
        print(f"{name} ({model.cfg.policy}, {device}, {args.threads} thread(s))")
        print("| words | target tokens | streaming ms/sentence | naive ms/sentence | speed-up | "
              "streaming ms/token | naive ms/token | identical |")
        print("|---:|---:|---:|---:|---:|---:|---:|:---:|")
        for r in rows:
            print(f"| {r['words']} | {r['target_tokens']:.1f} | {r['stream_ms']:.1f} | {r['naive_ms']:.1f} | "
                  f"{r['speedup']:.1f}x | {r['stream_ms_per_token']:.2f} | {r['naive_ms_per_token']:.2f} | "
                  f"{'yes' if r['identical'] else 'NO'} |")
        growth = rows[-1]["stream_ms_per_token"] / rows[0]["stream_ms_per_token"]
        print(f"streaming compute per written token, {rows[-1]['words']} vs {rows[0]['words']} words: "
              f"{growth:.2f}x")
        all_rows.append({"checkpoint": str(name), "policy": model.cfg.policy, "device": str(device), "rows": rows,
                         "per_token_growth": growth})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_rows, f, indent=1)
    return 0 if all(r["identical"] for a in all_rows for r in a["rows"]) else 1
