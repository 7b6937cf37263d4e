"""`simulserve train CONFIG`: train (or resume) a model from a YAML recipe."""
from __future__ import annotations

import argparse
import json


def register(sub) -> None:
    p = sub.add_parser(
        "train", help="train or resume a model from a YAML recipe",
        description="Train an offline, wait-k (multipath) or GMA model; rerunning the same command resumes.",
        epilog="examples:\n"
               "  simulserve train recipes/gma_delta1.yaml                  # rerun to resume\n"
               "  simulserve train recipes/waitk.yaml --max-minutes 120 --threads 1\n"
               "  torchrun --nproc_per_node 2 -m clients.cli train recipes/gma_delta1.yaml   # several GPUs",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="YAML recipe (see recipes/)")
    p.add_argument("--output", help="override the recipe's output directory")
    p.add_argument("--data", help="override the recipe's data directory")
    p.add_argument("--max-minutes", type=float, help="stop and save after this many minutes")
    p.add_argument("--max-steps", type=int, help="stop after this many updates in total")
    p.add_argument("--max-epochs", type=int, help="stop after this many epochs in total")
    p.add_argument("--init-from", help="override the recipe's init_from checkpoint (fine-tuning)")
    p.add_argument("--device", help="auto (default), cpu, cuda, cuda:N")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--export-only", action="store_true",
                   help="only (re)write OUTPUT/checkpoint from the saved epoch weights")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from models.training.train import Trainer, load_train_config
    overrides = {k: v for k, v in {
        "output": args.output, "data": args.data, "max_minutes": args.max_minutes,
        "max_steps": args.max_steps, "max_epochs": args.max_epochs, "device": args.device,
        "threads": args.threads, "init_from": args.init_from}.items() if v is not None}
    trainer = Trainer(load_train_config(args.config, overrides), progress=not args.no_progress)
    if args.export_only:
        print(trainer.export())
        return 0
    if trainer.resumed:
        print(f"resuming at step {trainer.step} (epoch {trainer.epoch + 1}, batch {trainer.position})")
    result = trainer.train()
    if trainer.rank == 0:
        print(json.dumps({k: v for k, v in result.items() if k != "history"}))
    return 0
