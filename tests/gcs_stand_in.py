"""gs:// as a machine without Google Cloud credentials, or without network, sees it: offline and fast.

gcsfs (the trainer image's gs://, `EPATH_USE_TF=0` here where TensorFlow is installed) is pointed at a
local endpoint (`STORAGE_EMULATOR_HOST`) that answers every request as Cloud Storage answers an
anonymous caller on a private bucket (401) or any caller of a bucket that does not exist (404), or at a port
that refuses connections (no network; gcsfs's pauses between its retries are skipped so that the test takes
no half minute). Finding no credentials
takes no metadata-server probe (`NO_GCE_CHECK`), and the gcloud configuration is an empty folder.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import sys
import threading

NO_CREDENTIALS, NO_BUCKET, NO_NETWORK = "no credentials", "no bucket", "no network"
KINDS = (NO_CREDENTIALS, NO_BUCKET, NO_NETWORK)
ANONYMOUS = "Anonymous caller does not have storage.objects.get access to the Google Cloud Storage object."
NO_SUCH_BUCKET = "The specified bucket does not exist."
# kind -> Cloud Storage's answer to every request: (status, message, reason).
_ANSWERS = {NO_CREDENTIALS: (401, ANONYMOUS, "required"), NO_BUCKET: (404, NO_SUCH_BUCKET, "notFound")}


class _Refusing(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        self.server.requests.append(self.path)
        status, message, reason = _ANSWERS[self.server.kind]
        body = json.dumps({"error": {"code": status, "message": message, "errors": [
            {"message": message, "domain": "global", "reason": reason}]}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _answer

    def log_message(self, *args):
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A client that hung up before the answer was written (gcsfs gives up on a 401 at once) is no error of
        the stand-in's; socketserver would print a traceback into the stderr that the tests read."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def endpoint(kind: str):
    """(the STORAGE_EMULATOR_HOST URL, the request paths it got)."""
    if kind == NO_NETWORK:
        with socket.socket() as sock:  # a port nothing listens on
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        yield f"http://127.0.0.1:{port}", []
        return
    server = _Server(("127.0.0.1", 0), _Refusing)
    server.requests, server.kind = [], kind
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.requests
    finally:
        server.shutdown()
        server.server_close()


def environment(url: str, gcloud_config_dir) -> dict[str, str]:
    """The variables that make this process's (or a child's) gs:// go to `url`, without credentials."""
    return {"STORAGE_EMULATOR_HOST": url, "EPATH_USE_TF": "0", "NO_GCE_CHECK": "true",
            "CLOUDSDK_CONFIG": str(gcloud_config_dir), "GOOGLE_APPLICATION_CREDENTIALS": ""}


@contextlib.contextmanager
def unreachable(kind: str, tmp_path):
    """gs:// in this process as `kind` (one of KINDS) has it; yields the request paths the endpoint got (none
    for NO_NETWORK)."""
    import gcsfs
    import gcsfs.retry
    import pytest
    from etils.epath import backend, gpath
    from google.auth.compute_engine import _metadata

    async def no_pause(_seconds):
        pass

    def fresh():  # gs:// file systems are cached per process; these hold the previous environment
        gpath._is_tf_installed.cache_clear()
        backend.fsspec_backend._get_filesystem.cache_clear()
        gcsfs.GCSFileSystem.clear_instance_cache()

    with endpoint(kind) as (url, requests), pytest.MonkeyPatch.context() as patch:
        for name, value in environment(url, tmp_path).items():
            patch.setenv(name, value)
        patch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
        patch.setattr(_metadata, "_NO_GCE_CHECK", True)  # read at import
        patch.setattr(gcsfs.retry, "asyncio", type("NoPauses", (), {"sleep": staticmethod(no_pause)}))
        fresh()
        try:
            yield requests
        finally:
            fresh()
