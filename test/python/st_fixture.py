"""A tiny sentence-transformers model made offline, for the tests and the
bench: a BertModel from a small BertConfig (dropout off unless asked) and
a fast WordLevel tokenizer over a local vocabulary, saved to a folder and
loaded as sentence-transformers loads any model (Transformer + mean
Pooling). No hub download."""

import os
import random
import shutil
import tempfile
import unittest

import torch

# Offline and quiet: nothing is fetched, and no progress bar fills the log.
for _name, _value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                      ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                      ("TRANSFORMERS_VERBOSITY", "error"),
                      ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(_name, _value)

WORDS = ["w%d" % i for i in range(60)]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_model_dir(path, hidden=16, layers=1, heads=2, dropout=0.0, seed=0):
    """Writes the model and tokenizer to `path` (once) and returns it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    if os.path.exists(os.path.join(path, "config.json")):
        return path
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
        model_max_length=64)
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=2 * hidden,
        max_position_embeddings=64, hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout)
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(path)
    fast.save_pretrained(path)
    return path


def load(path, dtype=torch.float32):
    """The SentenceTransformer at `path` (as made by make_model_dir)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Pooling, Transformer)

    transformer = Transformer(path, max_seq_length=64)
    pooling = Pooling(transformer.get_embedding_dimension(), "mean")
    model = SentenceTransformer(modules=[transformer, pooling],
                                device="cpu")
    return model.to(dtype)


def sentences(count, seed, length=(3, 9)):
    """`count` random sentences of the vocabulary's words."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(*length)))
            for _ in range(count)]


def columns(count, seed, n_columns=3):
    """(anchor, positive, negatives...) columns of `count` rows."""
    return [sentences(count, seed * 10 + c) for c in range(n_columns)]


def features(model, texts):
    """The tokenized batch of `texts`, as the trainer's collator passes it
    to a loss (one dict per column)."""
    return model.preprocess(texts)


def flat_grads(model):
    """Every parameter's gradient, one flat tensor (zeros where None)."""
    return torch.cat([(p.grad if p.grad is not None else
                       torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()])


class ModelTestCase(unittest.TestCase):
    """A test case whose class holds a tiny model folder, `cls.path`, in a
    temporary folder, `cls.dir`, removed at the end."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="dloss-st-")
        cls.path = make_model_dir(os.path.join(cls.dir, "model"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)
