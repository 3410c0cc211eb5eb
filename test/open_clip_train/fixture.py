"""What OpenCLIP's trainer runs on in the trainer test and bench: tiny
`local-dir:` model configs (a ViT CLIP, and a CoCa whose folder name holds
``coca``, so that the trainer picks CoCa's loss) and a csv data set of
generated 32x32 PNGs with captions, made here: no weights and no data come
from a hub."""

import csv
import json
import os
import random

VIT = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32,
                   "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32,
                 "heads": 2, "layers": 2},
}

COCA = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32,
                   "patch_size": 8, "head_width": 16,
                   "attentional_pool": True, "attn_pooler_heads": 2,
                   "output_tokens": True},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32,
                 "heads": 2, "layers": 2, "embed_cls": True,
                 "output_tokens": True},
    "multimodal_cfg": {"context_length": 16, "vocab_size": 49408,
                       "width": 32, "heads": 2, "layers": 1,
                       "attn_pooler_heads": 2},
    "custom_text": True,
}

# One BPE token each in OpenCLIP's SimpleTokenizer: every caption of
# caption() has the same token count (checked by the test), so that
# OpenCLIP's per-rank CoCa caption mean equals the global token mean.
COLOURS = ["red", "green", "blue", "yellow", "black", "white", "orange",
           "purple"]
SHAPES = ["square", "circle", "cross", "line", "dot"]
PLACES = ["left", "right", "top", "bottom"]


def write_model(folder, config):
    """A `local-dir:` model folder holding only open_clip_config.json (no
    weights: the trainer initialises the model from its seed)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "open_clip_config.json"), "w") as f:
        json.dump({"model_cfg": config, "preprocess_cfg": {}}, f)
    return "local-dir:" + folder


def caption(rng):
    return "a %s %s at the %s" % (rng.choice(COLOURS), rng.choice(SHAPES),
                                  rng.choice(PLACES))


def write_data(folder, count, seed=0):
    """`count` 32x32 PNGs of random coloured blocks and a tab-separated csv
    (OpenCLIP's default columns, filepath and title); returns its path."""
    from PIL import Image

    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    rows = []
    for i in range(count):
        image = Image.new("RGB", (32, 32), tuple(rng.randrange(256)
                                                 for _ in range(3)))
        for _ in range(4):
            x, y = rng.randrange(24), rng.randrange(24)
            block = Image.new("RGB", (8, 8), tuple(rng.randrange(256)
                                                   for _ in range(3)))
            image.paste(block, (x, y))
        path = os.path.join(folder, "%03d.png" % i)
        image.save(path)
        rows.append((path, caption(rng)))
    table = os.path.join(folder, "train.csv")
    with open(table, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(["filepath", "title"])
        writer.writerows(rows)
    return table
