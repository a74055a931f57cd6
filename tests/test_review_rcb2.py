"""Review rcb2 of task cb: the weights digest and the Hugging Face entry's write."""

from __future__ import annotations

import tracemalloc

import pytest

torch = pytest.importorskip("torch")

from privguard.integrations._weights import weights_digest  # noqa: E402


def test_the_digest_reads_each_parameter_in_place_not_as_a_bytes_copy():
    # .numpy().tobytes() made a second host copy of every parameter (of the largest, an
    # embedding say, at once) and cost about a quarter of the pass; the array's buffer is
    # hashed as it is. The digest is the same value.
    import hashlib

    model = torch.nn.Linear(1024, 1024)  # a 4 MiB weight
    expected = hashlib.sha256()
    for _name, p in model.named_parameters():
        t = p.detach().contiguous()
        expected.update(f"{t.dtype}{tuple(t.shape)};".encode())
        expected.update(bytes(t.reshape(-1).view(torch.uint8).numpy()))
    tracemalloc.start()
    try:
        digest = weights_digest(model)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert digest == expected.hexdigest()
    assert peak < 1 << 20  # no 4 MiB bytes object


def test_a_meta_or_conjugate_parameter_does_not_raise_a_builtin_exception():
    # A meta parameter (accelerate's offload) raised NotImplementedError and a conjugate
    # view RuntimeError, out of on_save and on_train_begin. Meta holds no values here: not
    # tied (None, as sharded weights); a conjugate view is digested by its values.
    assert weights_digest(torch.nn.Linear(3, 2, device="meta")) is None
    values = torch.randn(2, 3, dtype=torch.cfloat)
    viewed, resolved = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    viewed.weight = torch.nn.Parameter(values.conj())
    resolved.bias, resolved.weight = viewed.bias, torch.nn.Parameter(values.conj().resolve_conj())
    assert weights_digest(viewed) == weights_digest(resolved) is not None
