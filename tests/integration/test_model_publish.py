"""`inferfleet model publish` against a real S3 server (SeaweedFS)."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import pytest
from ansible_collections.inferfleet.fleet.plugins.module_utils.manifest import loads
from typer.testing import CliRunner

from inferfleet.commands.model import app
from inferfleet.publish import PublishError, parse_s3_url, publish

BUCKET = "publish-it"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def s3(seaweed_s3):
    client = seaweed_s3.client()
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)
    return seaweed_s3


@pytest.fixture
def model(tmp_path) -> Path:
    root = tmp_path / "model"
    (root / "tok").mkdir(parents=True)
    (root / "config.json").write_bytes(b'{"model_type": "llama"}\n')
    (root / "tok" / "tokenizer.json").write_bytes(os.urandom(1000))
    (root / "model.safetensors").write_bytes(os.urandom(12 * MiB + 3))
    return root


def url(name: str, version: str = "v1") -> str:
    return f"s3://{BUCKET}/models/{name}/{version}"


def keys(s3, prefix: str) -> list[str]:
    resp = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for o in resp.get("Contents", []))


# -- URLs -------------------------------------------------------------------------------
def test_parse_s3_url():
    loc = parse_s3_url("s3://bkt/models/llm/tiny/v3")
    assert (loc.bucket, loc.prefix, loc.name, loc.version) == ("bkt", "models/llm", "tiny", "v3")
    assert loc.key("manifest.json") == "models/llm/tiny/v3/manifest.json"
    assert parse_s3_url("s3://bkt/tiny/v3/").prefix == ""
    # with --name/--version the URL may stop at the prefix
    assert parse_s3_url("s3://bkt/models", "tiny", "v3").version_prefix == "models/tiny/v3/"
    assert parse_s3_url("s3://bkt/models/tiny/v3", "tiny", "v3").prefix == "models"
    for bad, msg in (("http://x/a/b", "not an s3:// URL"), ("s3://bkt/only", "NAME/VERSION"),
                     ("s3://ab/m/v1", "at least 3"), ("s3://bkt/m/current", "reserved"),
                     ("s3://bkt/m/v 1", "invalid model version")):
        with pytest.raises(PublishError, match=msg):
            parse_s3_url(bad)


# -- publishing ---------------------------------------------------------------------------
def test_cli_publishes_then_refuses_to_overwrite_without_force(s3, model):
    name = "p-" + uuid.uuid4().hex[:8]
    runner = CliRunner()
    result = runner.invoke(app, ["publish", str(model), url(name)], env=s3.env())
    assert result.exit_code == 0, result.output
    digest = result.stdout.strip().splitlines()[-1]
    manifest = loads(s3.client().get_object(
        Bucket=BUCKET, Key=f"models/{name}/v1/manifest.json")["Body"].read())
    assert digest == manifest["digest"]
    assert [f["path"] for f in manifest["files"]] == ["config.json", "model.safetensors",
                                                      "tok/tokenizer.json"]
    for f in manifest["files"]:
        body = s3.client().get_object(Bucket=BUCKET, Key=f"models/{name}/v1/{f['path']}")
        assert hashlib.sha256(body["Body"].read()).hexdigest() == f["sha256"]

    again = runner.invoke(app, ["publish", str(model), url(name)], env=s3.env())
    assert again.exit_code == 1
    assert "already published" in again.output and "--force" in again.output
    assert "Traceback" not in again.output


def test_large_files_go_multipart_and_the_manifest_does_not_trust_etags(s3, model):
    name = "p-" + uuid.uuid4().hex[:8]
    result = publish(model, url(name), client=s3.client(), part_size_mb=5)
    head = s3.client().head_object(Bucket=BUCKET, Key=f"models/{name}/v1/model.safetensors")
    assert head["ETag"].strip('"').endswith("-3")  # 12 MiB in 5 MiB parts
    entry = next(f for f in result.manifest["files"] if f["path"] == "model.safetensors")
    assert entry["sha256"] == hashlib.sha256(
        (model / "model.safetensors").read_bytes()).hexdigest()
    assert head["Metadata"]["sha256"] == entry["sha256"]


class RecordingClient:
    """A boto3 client that records the object operations in order."""

    def __init__(self, client, fail_on: str | None = None):
        self._client = client
        self.calls: list[tuple[str, str]] = []
        self.fail_on = fail_on

    def __getattr__(self, attr):
        real = getattr(self._client, attr)
        if attr not in ("upload_file", "put_object", "delete_object"):
            return real

        def call(*args, **kwargs):
            key = kwargs.get("Key") or args[2]
            self.calls.append((attr, key))
            if self.fail_on and key.endswith(self.fail_on):
                raise OSError(f"simulated failure uploading {key}")
            return real(*args, **kwargs)

        return call


def test_manifest_goes_last_and_force_hides_the_version_first(s3, model):
    name = "p-" + uuid.uuid4().hex[:8]
    recorder = RecordingClient(s3.client())
    publish(model, url(name), client=recorder)
    assert recorder.calls[-1] == ("put_object", f"models/{name}/v1/manifest.json")
    assert {c[0] for c in recorder.calls[:-1]} == {"upload_file"}

    (model / "tok" / "tokenizer.json").unlink()
    (model / "config.json").write_bytes(b'{"model_type": "llama", "v": 2}\n')
    recorder = RecordingClient(s3.client())
    result = publish(model, url(name), client=recorder, force=True)
    assert recorder.calls[0] == ("delete_object", f"models/{name}/v1/manifest.json")
    assert recorder.calls[-1] == ("put_object", f"models/{name}/v1/manifest.json")
    assert result.removed == [f"models/{name}/v1/tok/tokenizer.json"]
    assert keys(s3, f"models/{name}/v1/") == [f"models/{name}/v1/{k}" for k in (
        "config.json", "manifest.json", "model.safetensors")]


def test_an_interrupted_publish_never_looks_complete(s3, model):
    name = "p-" + uuid.uuid4().hex[:8]
    recorder = RecordingClient(s3.client(), fail_on="config.json")
    with pytest.raises(OSError, match="simulated failure"):
        publish(model, url(name), client=recorder, concurrency=1)
    assert f"models/{name}/v1/manifest.json" not in keys(s3, f"models/{name}/v1/")
    # publishing again (no --force needed: the version was never complete) finishes it
    result = publish(model, url(name), client=s3.client())
    body = s3.client().get_object(Bucket=BUCKET, Key=f"models/{name}/v1/manifest.json")
    assert json.loads(body["Body"].read())["digest"] == result.manifest["digest"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["publish", "/nonexistent-dir", "s3://bkt/m/v1"], "is not a folder"),
        (["publish", ".", "s3://bkt/just-one"], "NAME/VERSION"),
    ],
)
def test_cli_errors_are_one_line(args, message, s3):
    result = CliRunner().invoke(app, args, env=s3.env())
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1


def test_cli_unreachable_store_is_one_line(model):
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k",
           "AWS_SECRET_ACCESS_KEY": "s"}
    result = CliRunner().invoke(app, ["publish", str(model), "s3://bkt/m/v1"], env=env)
    assert result.exit_code == 1
    assert "error:" in result.output and "Traceback" not in result.output
    assert "127.0.0.1:9" in result.output
