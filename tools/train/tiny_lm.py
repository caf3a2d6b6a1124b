"""A small byte-level transformer language model and its data, shared by the
main job's trainers and by its single-process torch.optim reference, so that
both see exactly the same model, initial weights and batches.

The text is the Python standard library's own sources, as Debian ships them
(/usr/lib/python3.*/*.py), read as bytes (a vocabulary of 256). Batches are
drawn from a generator seeded by the step, so every process computes the
same batch of a step without talking to the others; trainer r of W takes
rows [r * B / W, (r + 1) * B / W) of it.
"""

import glob
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 256


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).permute(
            2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(width // self.heads)
        future = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
        attention = scores.masked_fill(future, float("-inf")).softmax(-1)
        return self.proj((attention @ v).transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """GPT-style: token and position embeddings, pre-norm blocks, a head."""

    def __init__(self, context, width, layers, heads):
        super().__init__()
        self.token = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1])
        return self.head(self.norm(self.blocks(self.token(tokens) + self.position(positions))))


def make_model(args):
    torch.manual_seed(0)  # Every process starts from the same weights.
    return TinyLM(args.context, args.width, args.layers, args.heads)


def load_corpus(max_bytes):
    """The standard library's top-level sources, in name order, as a byte tensor."""
    files = sorted(glob.glob("/usr/lib/python3*/*.py"))
    if not files:
        raise RuntimeError("no Python standard library sources under /usr/lib/python3*/")
    data = bytearray()
    for path in files:
        with open(path, "rb") as f:
            data += f.read()
        if len(data) >= max_bytes:
            break
    return torch.tensor(list(data[:max_bytes]), dtype=torch.long), len(files)


def batch(corpus, step, rows, context, rank=0, world_size=1):
    """This trainer's share of step `step`'s batch: (inputs, targets)."""
    generator = torch.Generator().manual_seed(1000 + step)
    starts = torch.randint(0, len(corpus) - context - 1, (rows,), generator=generator)
    share = starts[rank * rows // world_size:(rank + 1) * rows // world_size]
    windows = torch.stack([corpus[s:s + context + 1] for s in share.tolist()])
    return windows[:, :-1], windows[:, 1:]


def loss_of(model, inputs, targets):
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def add_model_arguments(parser):
    parser.add_argument("--context", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16, help="sequences per step, all trainers")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--corpus_bytes", type=int, default=4 << 20)
