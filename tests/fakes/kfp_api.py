"""FakeKfpApiServer: a FAKE Kubeflow Pipelines v2beta1 API (no KFP cluster can run here), just
the calls kfp.Client.create_run_from_pipeline_package makes: healthz, find/create experiment,
create run. The posted run bodies are kept in `.runs` for assertions."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeKfpApiServer:
    def __init__(self):
        self.requests: list[tuple[str, str]] = []
        self.runs: list[dict] = []
        self.experiments: list[dict] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeKfpApiServer":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, body: dict, code: int = 200):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                fake.requests.append(("GET", self.path))
                if self.path.startswith("/apis/v2beta1/experiments"):
                    self._send({"experiments": fake.experiments} if fake.experiments else {})
                else:
                    self._send({})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                fake.requests.append(("POST", self.path))
                if self.path.startswith("/apis/v2beta1/experiments"):
                    exp = {"experiment_id": f"exp-{len(fake.experiments)}", "display_name": body.get("display_name")}
                    fake.experiments.append(exp)
                    self._send(exp)
                elif self.path.startswith("/apis/v2beta1/runs"):
                    fake.runs.append(body)
                    self._send({"run_id": f"run-{len(fake.runs)}", "display_name": body.get("display_name"),
                                "experiment_id": body.get("experiment_id")})
                else:
                    self._send({"error": "fake: no route"}, 404)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
