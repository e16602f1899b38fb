"""The boto3 S3 client, and botocore's exceptions turned into one-line StoreErrors."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from model_store.errors import StoreError
from model_store.settings import StoreSettings, env_name

_BAD_CREDENTIALS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"}
_DENIED = {"AccessDenied", "403", "Forbidden", "AllAccessDisabled"}
MISSING = {"NoSuchKey", "404", "NotFound"}


def make_client(settings: StoreSettings) -> Any:
    config = Config(
        region_name=settings.region,
        connect_timeout=settings.connect_timeout_s,
        read_timeout=settings.read_timeout_s,
        retries={"max_attempts": settings.max_attempts, "mode": "standard"},
        # One pooled connection per worker thread, plus a few for the manifest and listings.
        max_pool_connections=settings.concurrency + 4,
        s3={"addressing_style": "path" if settings.path_style else "auto"},
        # botocore >= 1.36 adds CRC checksum headers to every upload by default, which several
        # S3-compatible servers reject; SHA-256 in our manifest is the integrity check anyway.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    try:
        return boto3.session.Session().client(
            "s3", endpoint_url=settings.endpoint_url, config=config
        )
    except BotoCoreError as exc:  # e.g. no region for AWS S3, malformed config file
        raise StoreError(f"cannot create the S3 client: {exc}") from None


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def translate(exc: Exception, client: Any, bucket: str, what: str) -> StoreError:
    """A one-line explanation of a failed S3 call; `what` names the object or action."""
    endpoint = client.meta.endpoint_url
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return StoreError(
            "no S3 credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE / a web identity)"
        )
    if isinstance(exc, BotoConnectionError):
        return StoreError(f"cannot reach the S3 endpoint {endpoint} ({type(exc).__name__})")
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code == "NoSuchBucket":
            return StoreError(f"bucket {bucket!r} does not exist at {endpoint}")
        # Name the endpoint, the bucket and the settings: "access denied" alone sends people
        # to the wrong knob (a wrong endpoint and a key without rights look alike from here).
        if code in _BAD_CREDENTIALS:
            return StoreError(
                f"{endpoint} rejected the credentials ({code}) for bucket {bucket!r}: check "
                f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and "
                f"{env_name('endpoint_url')} if that is the wrong server"
            )
        if code in _DENIED:
            return StoreError(
                f"access denied to {what} in bucket {bucket!r} at {endpoint}: check that the "
                f"key in AWS_ACCESS_KEY_ID (or AWS_PROFILE) may use that bucket (its user's "
                f"policy, the bucket policy), and {env_name('endpoint_url')} if that is the wrong "
                "server"
            )
        message = exc.response.get("Error", {}).get("Message", "") or code
        return StoreError(f"S3 error on {what}: {code}: {message}")
    if isinstance(exc, BotoCoreError):
        return StoreError(f"S3 request for {what} failed: {exc}")
    return StoreError(f"{what}: {exc}")


def check_bucket(client: Any, bucket: str) -> None:
    """Fail early, and clearly, on a missing bucket (HEAD answers a bare 404, no error code)."""
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if error_code(exc) in {"404", "NoSuchBucket", "NotFound"}:
            raise StoreError(
                f"bucket {bucket!r} does not exist at {client.meta.endpoint_url}"
            ) from None
        raise translate(exc, client, bucket, f"s3://{bucket}") from None
    except BotoCoreError as exc:
        raise translate(exc, client, bucket, f"s3://{bucket}") from None
