"""What the client and the worker share: the channel, the token, errors and retries."""

import logging
import os
import time
import urllib.parse

import grpc
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory

from meshwork.v1 import errors_pb2

log = logging.getLogger("meshwork")

CALL_TIMEOUT = 60.0  # seconds for one unary call (a long poll adds its wait)
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


class MeshworkError(Exception):
    """A call the coordinator refused (or that could not reach it).

    `code` is the gRPC status name (``"NOT_FOUND"``, ``"ABORTED"``, …),
    `message` the server's message and `reason` the ``meshwork.v1.ErrorInfo``
    reason (``"LEASE_EXPIRED"``, …) or ``""`` when the server sent none.
    """

    def __init__(self, code, message, reason=""):
        self.code, self.message, self.reason = code, message, reason
        why = f"; reason {reason}" if reason else ""
        super().__init__(f"{code}: {message}{why}")

    @classmethod
    def of(cls, error):
        """The MeshworkError for a grpc.RpcError (or any exception a call raised)."""
        if not isinstance(error, grpc.Call):
            return cls("UNKNOWN", str(error))
        return cls(error.code().name, error.details() or "", _reason(error))


def _status_class():
    """google.rpc.Status, built from its three fields (Debian has no grpcio-status)."""
    pool = descriptor_pool.Default()
    try:
        desc = pool.FindMessageTypeByName("google.rpc.Status")
    except KeyError:
        f = descriptor_pb2.FieldDescriptorProto
        fdp = descriptor_pb2.FileDescriptorProto(
            name="google/rpc/status.proto", package="google.rpc", syntax="proto3",
            dependency=[any_pb2.DESCRIPTOR.name])
        status = fdp.message_type.add(name="Status")
        status.field.add(name="code", number=1, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
        status.field.add(name="message", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
        status.field.add(name="details", number=3, type=f.TYPE_MESSAGE,
                         label=f.LABEL_REPEATED, type_name=".google.protobuf.Any")
        try:
            pool.AddSerializedFile(fdp.SerializeToString())
        except TypeError:  # another thread added it first
            pass
        desc = pool.FindMessageTypeByName("google.rpc.Status")
    return message_factory.MessageFactory(pool).GetPrototype(desc)


def _reason(error):
    """The meshwork.v1.ErrorInfo reason in the grpc-status-details-bin trailer, or ""."""
    try:
        trailers = error.trailing_metadata() or ()
    except Exception:  # no trailers arrived
        return ""
    for key, value in trailers:
        if key != "grpc-status-details-bin":
            continue
        try:
            for detail in _status_class().FromString(value).details:
                if detail.type_url.endswith("/meshwork.v1.ErrorInfo"):
                    return errors_pb2.ErrorInfo.FromString(detail.value).reason
        except Exception as e:  # a malformed detail is no reason to fail the call twice
            log.warning("could not decode grpc-status-details-bin: %s", e)
    return ""


class Connection:
    """One gRPC channel to a coordinator, with the bearer token on every call.

    `url` is ``http://HOST:PORT`` (plaintext HTTP/2, h2c), ``https://HOST[:PORT]``
    (TLS; `ca` is a PEM file to trust instead of grpcio's default roots) or a
    bare ``HOST:PORT`` (h2c). `token` defaults to ``$MESHWORK_TOKEN``.
    """

    def __init__(self, url, token=None, ca=None):
        self.token = os.environ.get("MESHWORK_TOKEN", "") if token is None else token
        target, tls = _target(url)
        # A coordinator on loopback is never reached through a proxy.
        options = [("grpc.enable_http_proxy", 0)] if target.rsplit(":", 1)[0] in LOOPBACK else []
        if tls:
            roots = None
            if ca is not None:
                with open(ca, "rb") as f:
                    roots = f.read()
            self.channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(roots), options)
        else:
            self.channel = grpc.insecure_channel(target, options)
        self.metadata = (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def call(self, method, request, retry=("UNAVAILABLE",), tries=5, timeout=CALL_TIMEOUT):
        """A unary call; again after a backoff (0.5, 1, 2, 4 s) while its code is in `retry`."""
        delay = 0.5
        for attempt in range(1, tries + 1):
            try:
                return method(request, metadata=self.metadata, timeout=timeout)
            except grpc.RpcError as e:
                error = MeshworkError.of(e)
                if not retryable(error, retry) or attempt == tries:
                    raise error from None
                log.warning("%s failed (%s); retry %d/%d in %.1fs",
                            type(request).__name__, error, attempt, tries - 1, delay)
                time.sleep(delay)
                delay *= 2

    def close(self):
        self.channel.close()


def retryable(error, codes):
    # ARTIFACT_TOO_LARGE is resource_exhausted too, but can never succeed later.
    return error.code in codes and error.reason != "ARTIFACT_TOO_LARGE"


def _target(url):
    """(HOST:PORT, tls) for a URL or a bare HOST:PORT."""
    if "://" not in url:
        return url, False
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a coordinator URL: {url!r} (http://HOST:PORT or https://HOST)")
    tls = parts.scheme == "https"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port or (443 if tls else 80)}", tls
