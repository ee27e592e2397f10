"""GRPO (or RLOO) with TRL on a tiny Qwen2 built in code, captured by rlprobe in one line.

    python examples/trl_grpo/train_grpo.py --out ./dumps/base
    python examples/trl_grpo/train_grpo.py --out ./dumps/bad --fault ref-bf16
    rlprobe compare ./dumps/base ./dumps/bad -o ./out

Nothing is downloaded: the model and the word-level tokenizer are built in code and saved to
--model-dir; the rewards are rules. Faults (each a config change a user could make):
  ref-bf16       the reference model is loaded in bfloat16 (model_init_kwargs.dtype)
  beta           a larger KL coefficient
  temperature    sampling temperature 0.7 instead of 1.0
  lr             ten times the learning rate
  sampling-seed  another seed (the prompt order stays: shuffle_dataset is off)
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny  # noqa: E402  (beside this file)

FAULTS = {
    "ref-bf16": {"grpo.model_init_kwargs": {"dtype": "bfloat16"}},
    "beta": {"grpo.beta": 0.1},
    "temperature": {"grpo.temperature": 0.7},
    "lr": {"grpo.learning_rate": 0.01},
    "sampling-seed": {"grpo.seed": 1},
}


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg = yaml.safe_load(Path(path or Path(__file__).with_name("config.yaml")).read_text(encoding="utf-8"))
    return with_overrides(cfg, overrides or {})


def cpu_rollout(prompts: list[str], trainer: Any) -> dict[str, list]:
    """TRL's `rollout_func` on the CPU: sample with the policy and return the sampling log-probs,
    as a vLLM server would (TRL saves them as sampling_per_token_logps, rlprobe as rollout_log_prob)."""
    import torch

    tokenizer = trainer.processing_class
    model = trainer.accelerator.unwrap_model(trainer.model)
    args = trainer.args
    prompt_ids, completion_ids, logprobs = [], [], []
    for prompt in prompts:
        ids = tokenizer(prompt)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0,
                                 max_new_tokens=args.max_completion_length, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id, output_scores=True,
                                 return_dict_in_generate=True)
        new = out.sequences[0, len(ids):].tolist()
        scores = [torch.log_softmax(s[0].float(), dim=-1)[t].item() for s, t in zip(out.scores, new)]
        prompt_ids.append(ids)
        completion_ids.append(new)
        logprobs.append(scores)
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}


def build_trainer(cfg: dict[str, Any], output_dir: str | Path, model_dir: str | Path | None = None) -> Any:
    """The TRL trainer the config describes (GRPOTrainer or RLOOTrainer), without rlprobe."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    m = cfg["model"]
    model_dir = tiny.build_model_dir(model_dir or Path(tempfile.gettempdir()) / "rlprobe_trl_tiny_qwen2",
                                     seed=m["seed"], hidden=m["hidden"], layers=m["layers"])
    common = dict(output_dir=str(output_dir), report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True)
    kwargs = {**cfg["grpo"], **common}
    if cfg.get("trainer", "grpo") == "rloo":
        from trl import RLOOConfig as Config, RLOOTrainer as Trainer
    elif cfg.get("trainer", "grpo") == "grpo":
        from trl import GRPOConfig as Config, GRPOTrainer as Trainer
    else:
        raise SystemExit(f"trainer: {cfg['trainer']!r}; expected grpo or rloo")
    extra = {"rollout_func": cpu_rollout} if cfg.get("rollout_func") else {}
    return Trainer(model=AutoModelForCausalLM.from_pretrained(model_dir),
                   reward_funcs=[tiny.even_words, tiny.short_answer], args=Config(**kwargs),
                   train_dataset=tiny.prompt_dataset(**cfg.get("prompts", {})),
                   processing_class=tiny.build_tokenizer(), **extra)


def train(cfg: dict[str, Any], out: str | Path | None = None, fault: str | None = None,
          model_dir: str | Path | None = None, probe: bool = True, mode: str = "overwrite") -> Any:
    """Train once; returns the trainer (its dump is at rlprobe_config.dump_path, or `out`)."""
    from rlprobe.integrations.trl import attach

    cfg = copy.deepcopy(cfg)
    if fault is not None:
        if fault not in FAULTS:
            raise SystemExit(f"--fault {fault!r}: expected one of {', '.join(FAULTS)}")
        cfg = with_overrides(cfg, FAULTS[fault])
    if out is not None:
        cfg.setdefault("rlprobe_config", {})["dump_path"] = str(out)
    dump = Path(cfg.get("rlprobe_config", {}).get("dump_path", "./rlprobe_dump"))
    with tempfile.TemporaryDirectory(prefix="trl_out_") as output_dir:
        trainer = build_trainer(cfg, output_dir, model_dir)
        if probe:
            attach(trainer, cfg, mode=mode)          # <- the one line
        trainer.train()
    trainer.rlprobe_dump = dump
    return trainer


def with_overrides(cfg: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of `cfg` with dotted keys set ({"grpo.beta": 0.1})."""
    cfg = copy.deepcopy(cfg)
    for dotted, value in overrides.items():
        node = cfg
        *parents, leaf = dotted.split(".")
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(Path(__file__).with_name("config.yaml")))
    ap.add_argument("--out", help="dump directory (overrides rlprobe_config.dump_path)")
    ap.add_argument("--fault", choices=sorted(FAULTS))
    ap.add_argument("--model-dir", help="where the tiny model is built (default: a folder in the temp dir)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set grpo.max_steps=5 --set trainer=rloo")
    args = ap.parse_args()
    overrides = {k: yaml.safe_load(v) for k, _, v in (item.partition("=") for item in args.set)}
    trainer = train(load_config(args.config, overrides), args.out, args.fault, args.model_dir)
    print(f"wrote {trainer.rlprobe_dump}")


if __name__ == "__main__":
    main()
