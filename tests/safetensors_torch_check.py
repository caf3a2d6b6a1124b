"""Checks a safetensors file against the fp32 tensors it should hold.

Usage: safetensors_torch_check.py FILE.safetensors EXPECTED_DIR

EXPECTED_DIR holds
  index.json  {"tensors": [{"name": ..., "shape": [...], "offset": N}, ...],
               "metadata": {key: value, ...}}
              where `offset` is the tensor's first element in values.bin;
  values.bin  raw little-endian float32.

FILE is loaded twice when it can be: (a) always, with the minimal reader
below, written from the format's published description (8-byte little-endian
header size, JSON header, data buffer; offsets that tile the buffer) and
checking it as strictly; (b) with the reference package's
`safetensors.torch.load_file` when `safetensors` is importable (it is not part
of Debian's python3-torch, so (b) needs a venv that has it). Every loader must
produce exactly the expected names, shapes, dtype float32, values (bit for
bit: compared as int32, so -0.0 and NaN payloads count) and metadata.

Exit status: 0 if every loader that ran agrees, 1 with a message naming the
first difference otherwise, 2 for bad usage.
"""
import json
import os
import struct
import sys

import torch

MAX_HEADER_SIZE = 100_000_000  # The reference implementation's limit.
DTYPES = {
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "F64": (torch.float64, 8),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}


class Mismatch(Exception):
    pass


def tensor_from_bytes(data, dtype, shape):
    # torch.frombuffer refuses an empty buffer; bytearray because it warns on
    # read-only ones.
    if len(data) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


def no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    dups = sorted({k for k in keys if keys.count(k) > 1})
    if dups:
        raise Mismatch(f"duplicate JSON keys {dups}")
    return dict(pairs)


def spec_read(path):
    """Returns ({name: tensor}, metadata dict) or raises Mismatch."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise Mismatch(f"{len(raw)} bytes: no room for the 8-byte header size")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > MAX_HEADER_SIZE:
        raise Mismatch(f"header size {n} over the {MAX_HEADER_SIZE} limit")
    if 8 + n > len(raw):
        raise Mismatch(f"header size {n} runs past the end of the file ({len(raw)} bytes)")
    try:
        text = raw[8:8 + n].decode("utf-8")
    except UnicodeDecodeError as e:
        raise Mismatch(f"header is not UTF-8: {e}")
    try:
        header = json.loads(text, object_pairs_hook=no_duplicate_keys)
    except json.JSONDecodeError as e:
        raise Mismatch(f"header is not JSON: {e}")
    if not isinstance(header, dict):
        raise Mismatch("header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise Mismatch(f"__metadata__ is not an object of strings: {metadata!r}")
    buffer = raw[8 + n:]
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise Mismatch(f"entry of {name!r} is not an object")
        dtype_name, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype_name not in DTYPES:
            raise Mismatch(f"tensor {name!r}: dtype {dtype_name!r} unknown to this reader")
        if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise Mismatch(f"tensor {name!r}: bad shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(
                isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)):
            raise Mismatch(f"tensor {name!r}: bad data_offsets {offsets!r}")
        count = 1
        for d in shape:
            count *= d
        size = count * DTYPES[dtype_name][1]
        if offsets[1] - offsets[0] != size:
            raise Mismatch(f"tensor {name!r}: shape {shape} of {dtype_name} is {size} bytes, "
                           f"data_offsets {offsets} say {offsets[1] - offsets[0]}")
        entries.append((offsets[0], offsets[1], name, dtype_name, shape))
    entries.sort()
    end = 0
    for begin, stop, name, _, _ in entries:
        if begin != end:
            what = "overlaps the previous tensor" if begin < end else f"leaves a hole at {end}"
            raise Mismatch(f"tensor {name!r} at [{begin}, {stop}) {what}")
        end = stop
    if end != len(buffer):
        raise Mismatch(f"tensors cover {end} bytes of a {len(buffer)}-byte data buffer")
    tensors = {
        name: tensor_from_bytes(buffer[begin:stop], DTYPES[dtype_name][0], shape)
        for begin, stop, name, dtype_name, shape in entries
    }
    return tensors, metadata


def reference_read(path):
    from safetensors import safe_open
    from safetensors.torch import load_file
    tensors = load_file(path)
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
    return tensors, metadata


def load_expected(expected_dir):
    with open(os.path.join(expected_dir, "index.json"), "r", encoding="utf-8") as f:
        index = json.load(f)
    with open(os.path.join(expected_dir, "values.bin"), "rb") as f:
        raw = f.read()
    if len(raw) % 4:
        raise Mismatch(f"values.bin has {len(raw)} bytes, not a multiple of 4")
    values = tensor_from_bytes(raw, torch.float32, [len(raw) // 4])
    expected = {}
    for t in index["tensors"]:
        count = 1
        for d in t["shape"]:
            count *= d
        offset = t["offset"]
        if offset + count > values.numel():
            raise Mismatch(f"expected tensor {t['name']!r} runs past the end of values.bin")
        expected[t["name"]] = values[offset:offset + count].reshape(t["shape"])
    return expected, index.get("metadata", {})


def compare(tensors, metadata, expected, expected_metadata):
    if sorted(tensors) != sorted(expected):
        missing = sorted(set(expected) - set(tensors))
        extra = sorted(set(tensors) - set(expected))
        raise Mismatch(f"tensor names differ: missing {missing}, unexpected {extra}")
    for name, want in expected.items():
        got = tensors[name]
        if got.dtype != torch.float32:
            raise Mismatch(f"tensor {name!r} has dtype {got.dtype}, want torch.float32")
        if list(got.shape) != list(want.shape):
            raise Mismatch(f"tensor {name!r} has shape {list(got.shape)}, "
                           f"want {list(want.shape)}")
        got_bits = got.contiguous().view(torch.int32).flatten()
        want_bits = want.contiguous().view(torch.int32).flatten()
        if not torch.equal(got_bits, want_bits):
            i = int(torch.nonzero(got_bits != want_bits)[0])
            raise Mismatch(
                f"tensor {name!r} element {i}: bits 0x{int(got_bits[i]) & 0xffffffff:08x}"
                f", want 0x{int(want_bits[i]) & 0xffffffff:08x} "
                f"({int((got_bits != want_bits).sum())} elements differ)")
    if dict(metadata) != dict(expected_metadata):
        raise Mismatch(f"metadata {dict(metadata)!r}, want {dict(expected_metadata)!r}")


def main(argv):
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    path, expected_dir = argv[1], argv[2]
    try:
        expected, expected_metadata = load_expected(expected_dir)
    except (OSError, ValueError, KeyError, TypeError, Mismatch) as e:
        print(f"FAIL: cannot read expected values from {expected_dir}: {e}", file=sys.stderr)
        return 1
    loaders = [("spec-reader", spec_read)]
    try:
        import safetensors
        loaders.append((f"safetensors {safetensors.__version__}", reference_read))
        skipped = ""
    except ImportError:
        skipped = " (safetensors package not importable: reference loader skipped)"
    print(f"loaded with: {', '.join(name for name, _ in loaders)}{skipped}")
    for name, load in loaders:
        try:
            tensors, metadata = load(path)
            compare(tensors, metadata, expected, expected_metadata)
        except Mismatch as e:
            print(f"FAIL: {path}: {name}: {e}", file=sys.stderr)
            return 1
        except Exception as e:  # The reference loader's own refusals, I/O errors.
            print(f"FAIL: {path}: {name} could not load it: {type(e).__name__}: {e}",
                  file=sys.stderr)
            return 1
    print(f"OK: {path}: {len(expected)} tensors and {len(expected_metadata)} metadata entries "
          f"match, bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
