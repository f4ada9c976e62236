# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""A small S3 client for nodes: standard library only (Python 3.8+).

What model_sync needs and nothing more: signed (AWS Signature V4) GET, ranged GET
and HEAD of objects, path-style addressing (``ENDPOINT/BUCKET/KEY``) against any
S3-compatible endpoint (AWS, SeaweedFS, MinIO, Ceph RGW). One keep-alive
connection per thread, so a thread pool can run parallel ranged GETs.

Secrets never enter an exception message: errors name the endpoint, bucket, key
and HTTP status only.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import re
import socket
import ssl
import threading
import time
from urllib.parse import quote, urlsplit

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
RETRYABLE_STATUS = (500, 502, 503, 504)
_CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
# socket.timeout is TimeoutError from Python 3.10 on, a plain OSError before.
_TIMEOUTS = (socket.timeout, TimeoutError)


class S3Error(Exception):
    """A request that failed; ``status`` is the HTTP status (0 when none came back)."""

    def __init__(self, message: str, status: int = 0, code: str = "", retryable: bool = False):
        super().__init__(message)
        self.status = status
        self.code = code
        self.retryable = retryable


class S3NotFound(S3Error):
    pass


class S3Unreachable(S3Error):
    pass


class S3Truncated(S3Error):
    pass


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret_key: str, date: str, region: str, service: str = "s3") -> bytes:
    k = _hmac(("AWS4" + secret_key).encode("utf-8"), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def encode_path(path: str) -> str:
    """URI-encode a path the way SigV4 wants it for S3: every byte but unreserved and '/'."""
    return quote(path, safe="/~")


def canonical_query(query: dict) -> str:
    pairs = sorted((quote(str(k), safe="~"), quote(str(v), safe="~")) for k, v in query.items())
    return "&".join(f"{k}={v}" for k, v in pairs)


def amz_now() -> str:
    """The current time in SigV4's format (UTC, YYYYMMDDTHHMMSSZ)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def sign_v4(method: str, host: str, path: str, query: dict, headers: dict, access_key: str,
            secret_key: str, region: str, amz_date: str,
            payload_hash: str = EMPTY_SHA256, session_token: str = "") -> dict:
    """Headers to add to a request (x-amz-date, x-amz-content-sha256, Authorization).

    ``path`` is already URI-encoded; ``headers`` are the other headers to sign.
    """
    date = amz_date[:8]
    out = {"x-amz-date": amz_date, "x-amz-content-sha256": payload_hash}
    if session_token:
        out["x-amz-security-token"] = session_token
    to_sign = {k.lower(): " ".join(str(v).strip().split()) for k, v in headers.items()}
    to_sign.update(out)
    to_sign["host"] = host
    names = sorted(to_sign)
    canonical_headers = "".join(f"{n}:{to_sign[n]}\n" for n in names)
    signed_headers = ";".join(names)
    canonical_request = "\n".join([method, path, canonical_query(query), canonical_headers,
                                   signed_headers, payload_hash])
    scope = f"{date}/{region}/s3/aws4_request"
    string_to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                                hashlib.sha256(canonical_request.encode("utf-8")).hexdigest()])
    signature = hmac.new(signing_key(secret_key, date, region), string_to_sign.encode("utf-8"),
                         hashlib.sha256).hexdigest()
    out["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
                            f"SignedHeaders={signed_headers}, Signature={signature}")
    return out


def parse_content_range(value: str) -> tuple:
    """(first, last, total) from 'bytes FIRST-LAST/TOTAL' (total None when '*')."""
    m = _CONTENT_RANGE_RE.match((value or "").strip())
    if not m:
        raise ValueError(f"bad Content-Range {value!r}")
    total = None if m.group(3) == "*" else int(m.group(3))
    return int(m.group(1)), int(m.group(2)), total


def _error_code(body: bytes) -> str:
    m = re.search(rb"<Code>([^<]{1,100})</Code>", body or b"")
    return m.group(1).decode("utf-8", "replace") if m else ""


class S3Client:
    """Path-style S3 client; safe to share between threads (one connection per thread)."""

    def __init__(self, endpoint: str, access_key: str = "", secret_key: str = "",
                 region: str = "us-east-1", session_token: str = "", timeout: float = 60.0,
                 validate_certs: bool = True, ca_bundle: str = "", retries: int = 4):
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise S3Error(f"invalid S3 endpoint {endpoint!r}: expected http(s)://HOST[:PORT]")
        default_port = 443 if parts.scheme == "https" else 80
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or default_port
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        self.host_header = host if self.port == default_port else f"{host}:{self.port}"
        self.endpoint = f"{parts.scheme}://{self.host_header}"
        self.base_path = parts.path.rstrip("/")
        self.access_key = access_key or ""
        self.secret_key = secret_key or ""
        self.session_token = session_token or ""
        self.region = region or "us-east-1"
        self.timeout = timeout
        self.retries = retries
        self._ssl = None
        if self.scheme == "https":
            ctx = ssl.create_default_context(cafile=ca_bundle or None)
            if not validate_certs:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._ssl = ctx
        self._local = threading.local()

    # -- plumbing -------------------------------------------------------------------
    @staticmethod
    def url(bucket: str, key: str = "") -> str:
        return f"s3://{bucket}/{key}"

    def _connection(self, fresh: bool = False) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and not fresh:
            return conn
        if conn is not None:
            conn.close()
        if self._ssl is not None:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                               context=self._ssl)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        self._local.conn = conn
        return conn

    def close(self) -> None:
        """Close this thread's connection (the next request opens a new one)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _headers(self, method: str, path: str, query: dict, extra: dict) -> dict:
        headers = dict(extra)
        headers["Host"] = self.host_header
        if self.access_key and self.secret_key:
            headers.update(sign_v4(method, self.host_header, path, query, {}, self.access_key,
                                   self.secret_key, self.region, amz_now(),
                                   session_token=self.session_token))
        return headers

    def _open(self, method: str, bucket: str, key: str, extra: dict = None,
              query: dict = None) -> http.client.HTTPResponse:
        """Send one request; return the response with its body unread (status < 300)."""
        query = query or {}
        path = encode_path(f"{self.base_path}/{bucket}/{key}" if key
                           else f"{self.base_path}/{bucket}")
        target = path + ("?" + canonical_query(query) if query else "")
        where = f"{self.url(bucket, key)} (endpoint {self.endpoint})"
        resp = None
        for attempt in range(2):  # a kept-alive connection the server closed: retry once
            conn = self._connection(fresh=attempt > 0)
            try:
                conn.request(method, target,
                             headers=self._headers(method, path, query, extra or {}))
                resp = conn.getresponse()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError,
                    ConnectionResetError) as exc:
                conn.close()
                if attempt:
                    raise S3Unreachable(f"connection to the store lost on {method} {where}: "
                                        f"{exc}", retryable=True) from None
            except _TIMEOUTS:
                conn.close()
                raise S3Unreachable(f"timed out after {self.timeout:.0f} s on {method} {where}",
                                    retryable=True) from None
            except ssl.SSLError as exc:
                conn.close()
                raise S3Unreachable(f"TLS error talking to {self.endpoint}: {exc}") from None
            except OSError as exc:
                conn.close()
                raise S3Unreachable(f"object store unreachable at {self.endpoint}: "
                                    f"{exc.strerror or exc}", retryable=True) from None
        if resp.status < 300:
            return resp
        body = resp.read(64 * 1024) if method != "HEAD" else b""
        resp.close()
        self.close()
        code = _error_code(body)
        detail = f"HTTP {resp.status}" + (f" {code}" if code else "")
        if resp.status == 404:
            raise S3NotFound(f"object not found: {where}: {detail}", 404, code)
        if resp.status in (401, 403):
            raise S3Error(f"access denied to {where}: {detail} (check the access key, secret "
                          "key and region)", resp.status, code)
        raise S3Error(f"{method} {where} failed: {detail}", resp.status, code,
                      retryable=resp.status in RETRYABLE_STATUS)

    def _retrying(self, fn):
        delay = 0.2
        attempt = 0
        while True:
            try:
                return fn()
            except S3Error as exc:
                self.close()
                attempt += 1
                if not exc.retryable or attempt > self.retries:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    # -- API ------------------------------------------------------------------------
    def head(self, bucket: str, key: str) -> dict:
        """Size and ETag of an object."""
        def once() -> dict:
            resp = self._open("HEAD", bucket, key)
            resp.read()
            return {"size": int(resp.getheader("Content-Length", "0")),
                    "etag": (resp.getheader("ETag") or "").strip('"')}
        return self._retrying(once)

    def get_bytes(self, bucket: str, key: str, limit: int = 64 * 1024 * 1024) -> bytes:
        """A whole (small) object in memory; refuses objects over ``limit`` bytes."""
        url = self.url(bucket, key)

        def once() -> bytes:
            resp = self._open("GET", bucket, key)
            try:
                length = resp.getheader("Content-Length")
                if length is not None and int(length) > limit:
                    raise S3Error(f"{url} is {length} bytes, over the {limit} byte limit")
                try:
                    data = resp.read()
                except (http.client.HTTPException, OSError) as exc:
                    raise S3Truncated(f"truncated body for {url}: {exc}",
                                      retryable=True) from None
                if length is not None and len(data) != int(length):
                    raise S3Truncated(f"truncated body for {url}: got {len(data)} of {length} "
                                      "bytes", retryable=True)
                return data
            except BaseException:
                self.close()
                raise
        return self._retrying(once)

    def get_range(self, bucket: str, key: str, start: int, end: int, into, on_data=None,
                  object_size: int = -1, chunk: int = 1024 * 1024) -> int:
        """Read bytes [start, end) of an object into ``into`` (offset ``start`` at index 0).

        ``on_data(offset, memoryview)`` is called after each chunk received, with the
        slice of ``into`` just filled. Transient failures (connection lost, truncated
        body, 5xx) are retried, resuming after the bytes already received, so every
        offset is delivered exactly once and in order. With ``object_size`` >= 0, an
        object of another size fails at once. Returns the bytes read (end - start).
        """
        view = memoryview(into)
        if len(view) < end - start:
            raise ValueError("buffer smaller than the range")
        received = [start]  # bytes up to here are in `into`, even if a try fails

        def tracked(offset: int, data: memoryview) -> None:
            received[0] = offset + len(data)
            if on_data is not None:
                on_data(offset, data)

        delay = 0.2
        attempt = 0
        while received[0] < end:
            try:
                self._get_range_once(bucket, key, start, received[0], end, view, tracked,
                                     object_size, chunk)
            except S3Error as exc:
                attempt += 1
                if not exc.retryable or attempt > self.retries:
                    if isinstance(exc, S3Truncated):
                        raise S3Truncated(f"{exc} (after {attempt} attempts)") from None
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        return end - start

    def _get_range_once(self, bucket: str, key: str, start: int, pos: int, end: int,
                        view: memoryview, tracked, object_size: int, chunk: int) -> None:
        url = self.url(bucket, key)
        resp = self._open("GET", bucket, key, {"Range": f"bytes={pos}-{end - 1}"})
        done = False
        try:
            if resp.status == 206:
                first, last, total = parse_content_range(resp.getheader("Content-Range", ""))
                if object_size >= 0 and total is not None and total != object_size:
                    raise S3Error(f"{url} is {total} bytes in the store but the manifest says "
                                  f"{object_size}")
                if first != pos or last != end - 1:
                    raise S3Error(f"{url}: asked for bytes {pos}-{end - 1}, got {first}-{last}")
            elif resp.status == 200:
                length = int(resp.getheader("Content-Length", "-1"))
                if object_size >= 0 and length != object_size:
                    raise S3Error(f"{url} is {length} bytes in the store but the manifest says "
                                  f"{object_size}")
                if pos != 0:
                    raise S3Error(f"{url}: the store ignored a Range request")
            else:
                raise S3Error(f"{url}: unexpected HTTP {resp.status}")
            while pos < end:
                at = pos - start
                try:
                    n = resp.readinto(view[at:at + min(chunk, end - pos)])
                except _TIMEOUTS:
                    raise S3Truncated(f"timed out reading {url} at byte {pos}",
                                      retryable=True) from None
                except (OSError, http.client.HTTPException) as exc:
                    raise S3Truncated(f"connection lost reading {url} at byte {pos}: {exc}",
                                      retryable=True) from None
                if not n:
                    raise S3Truncated(f"truncated body for {url}: the store sent bytes up to "
                                      f"{pos - 1} of {end - 1}", retryable=True)
                tracked(pos, view[at:at + n])
                pos += n
            done = resp.status == 206 or end == object_size
        finally:
            resp.close()
            if not done:  # a body left unread spoils the kept-alive connection
                self.close()
