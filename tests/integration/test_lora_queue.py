"""Per-request LoRA through the real stack: the API resolves ``lora`` against the roots of
``OMNIQ_LORA__ROOTS`` (a directory and an S3 prefix), a Celery worker process hot-swaps
the adapter into its tiny Wan (a registry entry listing ``lora``), and the MP4 matches
the pipeline's own call with that adapter loaded by diffusers; every refusal is a 400
naming its parameter that stores nothing."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch

from cli.embedded import EmbeddedS3
from tests.integration.conftest import isolated_stack
from tests.integration.stack import Stack
from tests.unit.diffusers_fixtures import TINY_SEQ_LEN, tiny_wan_entry, tiny_wan_pipeline
from tests.unit.lora_fixtures import CROSS_ATTN, FFN, SELF_ATTN, lora_weights, write_lora
from workers.media.mp4 import encode_mp4
from workers.pipelines.base import Media

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "tiny/wan-lora"
RANK = 4
JOB = {
    "model": MODEL,
    "prompt": "a red ball",
    "size": "32x32",
    "num_frames": 9,
    "fps": 16.0,
    "num_inference_steps": 3,
    "seed": 7,
}


@pytest.fixture(scope="module")
def lstack(module_dir: Path, s3_server: EmbeddedS3, redis_db: int) -> Iterator[Stack]:
    work = module_dir
    root = work / "loras"
    root.mkdir()
    # Strong adapters, so a LoRA job differs from a plain one far beyond x264's noise.
    style = lora_weights(SELF_ATTN + FFN + ["proj_out"], rank=RANK, seed=1, std=2.0)
    write_lora(root / "style", [], rank=RANK, seed=0, weights=style)
    write_lora(root / "cross", CROSS_ATTN, rank=RANK, seed=2, alpha=8.0)
    bad = lora_weights(SELF_ATTN[:1], rank=RANK, seed=3)
    bad["blocks.0.attn1.to_q.lora_A.weight"] = torch.randn(RANK, 5)
    write_lora(root / "misfit", [], rank=RANK, seed=0, weights=bad)
    weights = (root / "style" / "pytorch_lora_weights.safetensors").read_bytes()
    (work / "outside.safetensors").write_bytes(weights)
    os.symlink(work / "outside.safetensors", root / "link.safetensors")
    s3_server.client().put_object(
        Bucket=s3_server.bucket,
        Key="loras/style.safetensors",
        Body=(root / "style" / "pytorch_lora_weights.safetensors").read_bytes(),
    )
    registry = work / "models.toml"
    registry.write_text(
        tiny_wan_entry(MODEL, work / "tiny_wan")
        + '[model.spec]\nparameters = ["guidance_scale", "negative_prompt", "lora"]\n'
    )
    env = {
        "OMNIQ_MODEL_REGISTRY": str(registry),
        "OMNIQ_LORA__ROOTS": f"{root},s3://{s3_server.bucket}/loras",
        "OMNIQ_LORA__MAX_RANK": str(RANK),
    }
    with isolated_stack(work, s3_server, redis_db=redis_db, extra_env=env) as st:
        st.lora_root = root  # type: ignore[attr-defined]
        st.start(workers=1)
        yield st


def _decode(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _reference(tmp_path: Path, lora: Path | None) -> np.ndarray:
    """The pipeline's own call (with ``lora`` loaded by diffusers), encoded as the worker
    encodes, decoded."""
    pipe = tiny_wan_pipeline()
    if lora is not None:
        pipe.load_lora_weights(str(lora), adapter_name="only")
    out = pipe(
        JOB["prompt"],
        height=32,
        width=32,
        num_frames=9,
        num_inference_steps=3,
        generator=torch.Generator().manual_seed(7),
        output_type="np",
        max_sequence_length=TINY_SEQ_LEN,
    )
    frames = (np.asarray(out.frames[0]) * 255).round().clip(0, 255).astype(np.uint8)
    path = tmp_path / f"ref-{lora is not None}.mp4"
    encode_mp4(Media(frames=frames, fps=16.0), path)
    return _decode(path.read_bytes())


def _video(stack: Stack, client: Any, resp: Any) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    done = stack.wait_for(client, resp.json()["id"], timeout=180)
    assert done["status"] == "completed", (done, stack.log("w0"))
    return _decode(client.get(f"/v1/videos/{done['id']}/content").content)


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(int) - b.astype(int)).mean())


def test_lora_jobs_run_through_the_queue(lstack: Stack, tmp_path: Path) -> None:
    root: Path = lstack.lora_root  # type: ignore[attr-defined]
    style = root / "style" / "pytorch_lora_weights.safetensors"
    with lstack.client() as c:
        listed = {m["id"]: m.get("loras") for m in c.get("/v1/models").json()["data"]}
        assert listed[MODEL] == ["cross", "link", "misfit", "style"]
        # By path (JSON), then none, then by catalog name as vLLM-Omni's ComfyUI node
        # sends it (multipart, JSON text, nulls for what is not set), then from S3.
        lora = {"name": "style", "local_path": str(root / "style"), "scale": 1.0, "int_id": 0}
        with_a = _video(lstack, c, c.post("/v1/videos", json={**JOB, "lora": lora}))
        plain = _video(lstack, c, c.post("/v1/videos", json=JOB))
        node = {"local_path": None, "name": "style", "scale": 1.0, "int_id": None}
        form = {k: str(v) for k, v in JOB.items()} | {"lora": json.dumps(node)}
        by_name = _video(lstack, c, c.post("/v1/videos", data=form, files={"x": ("", b"")}))
        s3 = {"name": "s3-style", "local_path": f"s3://{lstack.s3.bucket}/loras/style.safetensors"}
        from_s3 = _video(lstack, c, c.post("/v1/videos", json={**JOB, "lora": s3}))
        # An adapter of another shape fails the job, before denoise; the next is plain.
        misfit = c.post("/v1/videos", json={**JOB, "lora": {"name": "misfit"}})
        done = lstack.wait_for(c, misfit.json()["id"], timeout=120)
        assert done["status"] == "failed" and done["error"]["code"] == "invalid_lora", done
        assert done["step"] == 0
        again = _video(lstack, c, c.post("/v1/videos", json=JOB))

    want_a, want_plain = _reference(tmp_path, style), _reference(tmp_path, None)
    assert _diff(want_a, want_plain) > 3  # the adapter changes the video (~5 levels)
    # Each video is its own reference's (x264 under load: see test_diffusers_queue), and
    # much closer to it than to the other one.
    for got in (with_a, by_name, from_s3):
        assert _diff(got, want_a) < min(4, _diff(got, want_plain) / 2)
    for got in (plain, again):
        assert _diff(got, want_plain) < min(4, _diff(got, want_a) / 2)


@pytest.mark.parametrize(
    ("lora", "param"),
    [
        ({"name": "x", "local_path": "/etc/passwd"}, "lora.local_path"),
        ({"name": "x", "local_path": "{root}/../outside.safetensors"}, "lora.local_path"),
        ({"name": "x", "local_path": "{root}/link.safetensors"}, "lora.local_path"),
        ({"name": "x", "local_path": "{root}/nothing.safetensors"}, "lora.local_path"),
        ({"name": "x", "local_path": "https://example.com/a.safetensors"}, "lora.local_path"),
        ({"name": "x", "local_path": "file:///etc/passwd"}, "lora.local_path"),
        ({"name": "x", "local_path": "s3://elsewhere/loras/a.safetensors"}, "lora.local_path"),
        ({"name": "x", "local_path": "s3://{bucket}/loras/none.safetensors"}, "lora.local_path"),
        ({"name": "x", "local_path": "relative/a.safetensors"}, "lora.local_path"),
        ({"name": "style", "scale": 9.0}, "lora.scale"),
        ({"name": "style", "scale": "much"}, "lora.scale"),
        ({"name": "no-such-adapter"}, "lora.name"),
        ({"scale": 1.0}, "lora.name"),
        ({"name": "style", "weights": 1}, "lora.weights"),
        ({"name": "style", "int_id": -1}, "lora.int_id"),
        ({"name": "style", "int_id": 7}, "lora.int_id"),  # a cache id cannot act here
    ],
)
def test_bad_lora_is_refused_and_stores_nothing(
    lstack: Stack, lora: dict[str, Any], param: str
) -> None:
    root: Path = lstack.lora_root  # type: ignore[attr-defined]
    lora = {
        k: v.format(root=root, bucket=lstack.s3.bucket) if isinstance(v, str) else v
        for k, v in lora.items()
    }
    before = lstack.count_jobs()
    with lstack.client() as c:
        resp = c.post("/v1/videos", json={**JOB, "lora": lora})
        form = {k: str(v) for k, v in JOB.items()} | {"lora": json.dumps(lora)}
        resp_form = c.post("/v1/videos", data=form, files={"x": ("", b"")})
    for r in (resp, resp_form):
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error
        assert error["message"]
    assert lstack.count_jobs() == before
