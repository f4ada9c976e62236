"""Read a model's ``config.json`` and safetensors headers, from a folder or S3.

No weights are read. A safetensors file starts with an 8-byte little-endian
unsigned length N, then N bytes of JSON: for every tensor its ``dtype``,
``shape`` and ``data_offsets`` [begin, end) into the data that follows. So two
small reads per file (S3: two ranged GETs) give every tensor's exact size.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.errors import PlannerError

#: The safetensors format caps the header at 100 MB; a bigger length means the
#: file is not safetensors (or is corrupt).
MAX_HEADER_BYTES = 100 * 1000 * 1000

#: Bytes per element of each safetensors dtype code (sub-byte types are
#: packed; their size is taken from ``data_offsets`` only).
DTYPE_BYTES: dict[str, float] = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "I8": 1, "U8": 1, "BOOL": 1,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "F6_E2M3": 0.75, "F6_E3M2": 0.75, "F4": 0.5,
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a checkpoint (or of an estimate built from the config)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n


@dataclass(frozen=True)
class ModelSource:
    """What was read: the config, and the tensors when headers were available."""

    location: str
    config: dict[str, Any]
    tensors: tuple[TensorInfo, ...] | None
    files: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.location.rstrip("/").rsplit("/", 1)[-1] or self.location


def header_length(prefix: bytes) -> int:
    """The JSON header length from a file's first 8 bytes."""
    if len(prefix) < 8:
        raise PlannerError("file is shorter than the 8-byte safetensors header length.")
    (length,) = struct.unpack("<Q", prefix[:8])
    if length == 0 or length > MAX_HEADER_BYTES:
        raise PlannerError(
            f"header length {length} is outside 1..{MAX_HEADER_BYTES}: not a safetensors file."
        )
    return length


def parse_header(raw: bytes, file_size: int | None = None, origin: str = "") -> list[TensorInfo]:
    """Tensors described by a safetensors JSON header.

    Checks that each tensor's byte range matches dtype x shape (for whole-byte
    dtypes) and, when the file size is known, lies inside the file.
    """
    where = f" in {origin}" if origin else ""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PlannerError(f"safetensors header{where} is not valid JSON: {err}") from err
    if not isinstance(header, dict):
        raise PlannerError(f"safetensors header{where} is not a JSON object.")
    data_start = 8 + len(raw)
    tensors: list[TensorInfo] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(entry["dtype"])
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as err:
            raise PlannerError(
                f"tensor {name!r}{where} lacks dtype/shape/data_offsets."
            ) from err
        if end < begin:
            raise PlannerError(f"tensor {name!r}{where} has data_offsets {begin}..{end}.")
        info = TensorInfo(name=name, dtype=dtype, shape=shape, nbytes=end - begin)
        size = DTYPE_BYTES.get(dtype)
        if size is not None and size >= 1 and info.numel * size != info.nbytes:
            raise PlannerError(
                f"tensor {name!r}{where}: {dtype} {list(shape)} needs "
                f"{int(info.numel * size)} bytes but data_offsets span {info.nbytes}."
            )
        if file_size is not None and data_start + end > file_size:
            raise PlannerError(
                f"tensor {name!r}{where} ends at byte {data_start + end}, past the end of "
                f"the {file_size}-byte file (truncated upload?)."
            )
        tensors.append(info)
    return tensors


def read_local_header(path: Path) -> list[TensorInfo]:
    """Tensors of one local safetensors file, reading only its header."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        length = header_length(handle.read(8))
        raw = handle.read(length)
    if len(raw) != length:
        raise PlannerError(f"{path}: header says {length} bytes, file ends first.")
    return parse_header(raw, file_size=size, origin=str(path))


def select_weight_files(names: Iterable[str], index: dict[str, Any] | None) -> list[str]:
    """The safetensors files vLLM would load.

    With ``model.safetensors.index.json``, the files its ``weight_map`` names.
    Otherwise every ``*.safetensors``, except Mistral's ``consolidated*`` copy when
    Hugging Face shards sit beside it (the two hold the same weights).
    """
    names = sorted(n for n in names if n.endswith(".safetensors"))
    if index and isinstance(index.get("weight_map"), dict):
        wanted = set(index["weight_map"].values())
        return [n for n in names if n.rsplit("/", 1)[-1] in wanted]
    hf = [n for n in names if not n.rsplit("/", 1)[-1].startswith("consolidated")]
    return hf or names


def _load_json(raw: bytes, origin: str) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PlannerError(f"{origin} is not valid JSON: {err}") from err
    if not isinstance(value, dict):
        raise PlannerError(f"{origin} does not hold a JSON object.")
    return value


def load_local(location: str) -> ModelSource:
    """A model folder (config.json + safetensors), or a lone config.json file."""
    path = Path(location).expanduser()
    if path.is_file() and path.suffix == ".json":
        return ModelSource(location, _load_json(path.read_bytes(), str(path)), None)
    if not path.is_dir():
        raise PlannerError(
            f"{location}: no such folder. Give a model folder holding config.json, a "
            "config.json file, or s3://bucket/prefix."
        )
    config_path = path / "config.json"
    if not config_path.is_file():
        raise PlannerError(f"{location}: no config.json in this folder.")
    config = _load_json(config_path.read_bytes(), str(config_path))
    index_path = path / "model.safetensors.index.json"
    index = _load_json(index_path.read_bytes(), str(index_path)) if index_path.is_file() else None
    files = select_weight_files((p.name for p in path.iterdir()), index)
    if not files:
        return ModelSource(location, config, None)
    tensors: list[TensorInfo] = []
    for name in files:
        tensors.extend(read_local_header(path / name))
    return ModelSource(location, config, tuple(tensors), tuple(files))


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> (``bucket``, ``some/prefix/``)."""
    rest = url.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise PlannerError(f"{url}: expected s3://bucket/prefix.")
    prefix = prefix.strip("/")
    return bucket, (prefix + "/") if prefix else ""


def _s3_error(url: str, err: Exception) -> PlannerError:
    response = getattr(err, "response", None)
    code = str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""
    name = type(err).__name__
    if name == "NoCredentialsError":
        hint = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or an AWS profile)."
    elif name in {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError"}:
        hint = "check --endpoint-url / AWS_ENDPOINT_URL and that the store is reachable."
    elif code in {"NoSuchBucket", "NoSuchKey", "404"}:
        hint = "check the bucket and prefix (is the model published there?)."
    elif code in {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"}:
        hint = "check the credentials and the bucket policy."
    else:
        hint = "check the URL, the endpoint and the credentials."
    return PlannerError(f"{url}: S3 request failed ({code or name}: {err}); {hint}")


def make_s3_client(endpoint_url: str | None = None) -> Any:
    """A boto3 S3 client; the endpoint comes from the argument or AWS_ENDPOINT_URL."""
    import boto3  # imported here so the planner's pure parts need no boto3

    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
    return boto3.client("s3", endpoint_url=endpoint)


def load_s3(url: str, client: Any) -> ModelSource:
    """config.json plus safetensors headers through ranged GETs."""
    bucket, prefix = split_s3_url(url)
    try:
        sizes: dict[str, int] = {}
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                if "/" not in key[len(prefix):]:  # only this folder, not sub-folders
                    sizes[key[len(prefix):]] = int(obj["Size"])
        if "config.json" not in sizes:
            raise PlannerError(f"{url}: no config.json under this prefix.")

        def get(key: str, byte_range: str | None = None) -> bytes:
            kwargs: dict[str, Any] = {"Bucket": bucket, "Key": prefix + key}
            if byte_range:
                kwargs["Range"] = byte_range
            return client.get_object(**kwargs)["Body"].read()

        config = _load_json(get("config.json"), f"{url}config.json")
        index = None
        if "model.safetensors.index.json" in sizes:
            index = _load_json(get("model.safetensors.index.json"), "index.json")
        files = select_weight_files(sizes, index)
        tensors: list[TensorInfo] = []
        for name in files:
            length = header_length(get(name, "bytes=0-7"))
            raw = get(name, f"bytes=8-{8 + length - 1}")
            if len(raw) != length:
                raise PlannerError(f"{url}{name}: short read of the safetensors header.")
            tensors.extend(parse_header(raw, file_size=sizes[name], origin=f"{url}{name}"))
    except PlannerError:
        raise
    except Exception as err:  # botocore raises many classes; all become one message
        if type(err).__module__.startswith(("botocore", "boto3", "urllib3")):
            raise _s3_error(url, err) from err
        raise
    return ModelSource(url, config, tuple(tensors) if files else None, tuple(files))


def load_model(location: str, endpoint_url: str | None = None, s3_client: Any = None
               ) -> ModelSource:
    """Read a model from a folder, a config.json file, or ``s3://bucket/prefix``."""
    if location.startswith("s3://"):
        return load_s3(location, s3_client or make_s3_client(endpoint_url))
    return load_local(location)
