"""`s3://bucket/prefix` as a value."""

from __future__ import annotations

import re
from dataclasses import dataclass

from model_store.errors import UsageError

# S3's rules for new buckets (3-63 chars, lowercase, digits, dots, hyphens): anything else is a typo.
BUCKET = r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]"
_BUCKET = re.compile(rf"^{BUCKET}$")
# A prefix's segments, between any leading and trailing slashes: no empty one.
_PREFIX = r"/+([^/]+(/[^/]+)*/*)?"
# What `S3Url.parse` takes, as one regular expression (RE2 syntax too: the chart's values schema
# is generated from these, deploy/helm/values_schema.py). URL_UNDER: a prefix under the bucket.
URL = rf"^s3://{BUCKET}({_PREFIX})?$"
URL_UNDER = rf"^s3://{BUCKET}/+[^/]+(/[^/]+)*/*$"


@dataclass(frozen=True)
class S3Url:
    bucket: str
    prefix: str  # no leading or trailing slash; "" for the bucket itself

    @classmethod
    def parse(cls, text: str) -> S3Url:
        if not text.startswith("s3://"):
            raise UsageError(f"{text!r} is not an s3://bucket/prefix URL")
        bucket, _, prefix = text[len("s3://") :].partition("/")
        if not _BUCKET.match(bucket):
            raise UsageError(f"{text!r}: {bucket!r} is not a valid bucket name")
        prefix = prefix.strip("/")
        if "//" in prefix:
            raise UsageError(f"{text!r}: empty path segment in the prefix")
        return cls(bucket, prefix)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def child(self, name: str) -> S3Url:
        return S3Url(self.bucket, self.key(name.strip("/")))

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
