"""The lab's S3 server is real: a tiny model goes up with boto3 and comes back identical."""

import hashlib
import subprocess

import boto3
import pytest
from botocore.exceptions import ClientError

from inferfleet.lab import services
from inferfleet.lab.tinymodel import generate

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab(node_image):
    name = "inferfleet-test-services"
    services.down(name)
    lab = services.up(name, node_image)
    yield lab
    services.down(name)


def _client(lab, secret=None):
    env = lab.s3_env()
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=secret or env["AWS_SECRET_ACCESS_KEY"],
    )


def test_tiny_model_round_trip_is_byte_identical(lab, tmp_path):
    model = generate(tmp_path / "m", seed=3)
    s3 = _client(lab)
    s3.create_bucket(Bucket="models")
    for f in sorted(model.iterdir()):
        s3.upload_file(str(f), "models", f"tiny/v1/{f.name}")
    for f in sorted(model.iterdir()):
        body = s3.get_object(Bucket="models", Key=f"tiny/v1/{f.name}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == hashlib.sha256(f.read_bytes()).hexdigest()


def test_wrong_secret_is_refused(lab):
    with pytest.raises(ClientError) as err:
        _client(lab, secret="not-the-secret").list_buckets()
    assert err.value.response["Error"]["Code"] in {"SignatureDoesNotMatch", "AccessDenied"}


def test_down_removes_what_up_made_and_nothing_else(node_image):
    name = "inferfleet-test-down"
    services.up(name, node_image)
    removed = services.down(name)
    assert len(removed) == 2  # the S3 container and the network
    assert services.down(name) == []


def test_up_replaces_an_s3_container_cut_off_from_its_network(node_image):
    """What a molecule destroy leaves: the network gone, the S3 container still there."""
    name = "inferfleet-test-cutoff"
    services.down(name)
    try:
        first = services.up(name, node_image)
        subprocess.run(["docker", "network", "disconnect", "--force", name, first.s3_container],
                       check=True)
        again = services.up(name, node_image)
        listed = boto3.client(
            "s3", endpoint_url=again.s3_endpoint_host, region_name="us-east-1",
            aws_access_key_id=services.S3_ACCESS_KEY,
            aws_secret_access_key=services.S3_SECRET_KEY,
        ).list_buckets()
        assert listed["ResponseMetadata"]["HTTPStatusCode"] == 200
    finally:
        services.down(name)
