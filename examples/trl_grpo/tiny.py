"""A tiny Qwen2-architecture model, its tokenizer and a prompt set, all built in code (nothing downloaded).

The model is saved to a folder and loaded back from it, as a user's checkpoint would be: TRL
builds the reference model from the policy's `name_or_path`, so the policy must come from a path.
"""

from __future__ import annotations

from pathlib import Path

WORDS = ["red", "green", "blue", "cat", "dog", "bird", "one", "two", "three", "even", "odd", "yes", "no"]
SPECIALS = ["<pad>", "<eos>", "<unk>"]


def build_tokenizer():
    """A word-level tokenizer over WORDS (the `tokenizers` library), wrapped for transformers."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders

    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def build_model_dir(folder: str | Path, *, seed: int = 0, hidden: int = 32, layers: int = 2) -> Path:
    """Create (once) a randomly initialised tiny Qwen2 causal LM and its tokenizer in `folder`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = Path(folder)
    if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
        return folder
    tokenizer = build_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64, tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def prompt_dataset(count: int = 16, seed: int = 0):
    """`count` prompts of three to five words, in a datasets.Dataset with a `prompt` column."""
    import random

    from datasets import Dataset

    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 5))) for _ in range(count)]
    return Dataset.from_dict({"prompt": prompts})


def even_words(completions: list[str], **kwargs) -> list[float]:
    """A rule reward: the share of words in the completion that are 'even' or 'two'."""
    out = []
    for text in completions:
        words = text.split()
        out.append(sum(w in ("even", "two") for w in words) / max(len(words), 1))
    return out


def short_answer(completions: list[str], **kwargs) -> list[float]:
    """A second rule reward: shorter completions score higher."""
    return [1.0 / (1 + len(text.split())) for text in completions]
