"""One operation through any of the three public surfaces a user has: the Client, the
AsyncClient, and HTTP (`cairn serve`), for the admin or a tenant. What each answers comes
back in one shape (a run as its JSON, a list of runs as JSON), and how each refuses comes
back as one of three errors:

- Refused: the surface said no as it documents (a CairnError, an HTTP 4xx): nothing done;
- Unavailable: it could not be reached (`cairn serve` restarting, a connection lost);
- ServerError: it failed in a way it does not document (an HTTP 5xx): an invariant broken.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairn.testing.mix.rig import MixFleet


class Refused(Exception):
    """The surface refused the operation, as documented (kind: the error's name)."""

    def __init__(self, kind: str, message: str = "") -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class Unavailable(Exception):
    """The surface could not be reached."""


class ServerError(Exception):
    """An HTTP 5xx: an error the surface does not document."""


def _run_json(run: Any) -> dict[str, Any] | None:
    if run is None:
        return None
    got: dict[str, Any] = json.loads(json.dumps(run.to_json(), default=str))
    return got


class Surface:
    """The operations of a program on the fleet, through `via` as `tenant` (None: the
    admin)."""

    def __init__(self, fleet: MixFleet, via: str, tenant: str | None) -> None:
        self.fleet, self.via, self.tenant = fleet, via, tenant

    # -- plumbing ----------------------------------------------------------------------------
    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Client.method (or AsyncClient's), its CairnError as Refused."""
        from cairn.core.errors import CairnError

        try:
            if self.via == "async":
                face = self.fleet.aclient(self.tenant)
                return self.fleet.run(getattr(face, method)(*args, **kwargs))
            return getattr(self.fleet.client(self.tenant), method)(*args, **kwargs)
        except CairnError as exc:
            raise Refused(type(exc).__name__, str(exc)) from exc

    def _http(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        import httpx

        try:
            resp = self.fleet.http(self.tenant).request(
                method, path, json=body, params={k: v for k, v in params.items() if v is not None}
            )
        except httpx.TransportError as exc:
            raise Unavailable(f"{method} {path}: {exc}") from exc
        if resp.status_code >= 500:
            # The server closes the connection after a 500: the next request gets a new one.
            self.fleet.forget_http()
            raise ServerError(f"{method} {path} answered {resp.status_code}: {resp.text[:300]}")
        if resp.status_code >= 400:
            try:
                error = resp.json()["error"]
                kind, message = error["type"], error.get("message", "")
            except (ValueError, KeyError, TypeError):
                kind, message = f"http_{resp.status_code}", resp.text[:200]
            raise Refused(kind, message)
        return resp.json() if resp.content else None

    # -- writes -----------------------------------------------------------------------------
    def enqueue(self, flow: str, data: dict[str, Any], run_id: str | None, **options: Any) -> str:
        options = {k: v for k, v in options.items() if v is not None}
        if self.via == "http":
            body = {"workflow": flow, "input": data, "run_id": run_id, **options}
            if "debounce_key" in options:
                body.pop("run_id")
            return str(self._http("POST", "/runs", body)["run_id"])
        return str(self._call("enqueue", flow, data, run_id=run_id, **options))

    def signal(self, run_id: str, payload: Any, signal_id: str) -> bool:
        if self.via == "http":
            body = {"payload": payload, "signal_id": signal_id}
            return bool(self._http("POST", f"/runs/{run_id}/signals/go", body)["stored"])
        return bool(self._call("signal", run_id, "go", payload, signal_id=signal_id))

    def steer(self, run_id: str, message: Any) -> int:
        if self.via == "http":
            return int(self._http("POST", f"/runs/{run_id}/steer", {"message": message})["n"])
        return int(self._call("steer", run_id, message))

    def cancel(self, run_id: str) -> None:
        if self.via == "http":
            self._http("POST", f"/runs/{run_id}/cancel", {})
        else:
            self._call("cancel", run_id)

    def fork(self, run_id: str, at_seq: int, new_run_id: str, patch: dict[str, Any]) -> str:
        if self.via == "http":
            body = {"at_seq": at_seq, "new_run_id": new_run_id, "input_patch": patch}
            return str(self._http("POST", f"/runs/{run_id}/fork", body)["run_id"])
        return str(
            self._call("fork", run_id, at_seq=at_seq, new_run_id=new_run_id, input_patch=patch)
        )

    def rewind(self, run_id: str, to_seq: int) -> None:
        if self.via == "http":
            self._http("POST", f"/runs/{run_id}/rewind", {"to_seq": to_seq})
        else:
            self._call("rewind", run_id, to_seq=to_seq)

    # -- reads ------------------------------------------------------------------------------
    def get(self, run_id: str) -> dict[str, Any] | None:
        if self.via == "http":
            try:
                return dict(self._http("GET", f"/runs/{run_id}"))
            except Refused as exc:
                if exc.kind in ("unknown_run", "http_404", "not_found"):
                    return None
                raise
        return _run_json(self._call("get", run_id))

    def list_runs(self, limit: int = 200) -> list[dict[str, Any]]:
        if self.via == "http":
            return list(self._http("GET", "/runs", limit=limit)["runs"])
        return [r for r in (_run_json(x) for x in self._call("list", None, limit)) if r]

    def counts(self) -> dict[str, int]:
        if self.via == "http":
            return dict(self._http("GET", "/counts"))
        return {str(k): int(v) for k, v in self._call("counts").items()}

    def of_run(self, what: str, run_id: str) -> list[Any]:
        """history, calls, children or forks of the run, as JSON ([] for none)."""
        if self.via == "http":
            path = {"history": "steps"}.get(what, what)
            try:
                found = self._http("GET", f"/runs/{run_id}/{path}")
            except Refused as exc:
                if exc.kind in ("unknown_run", "http_404", "not_found"):
                    return []
                raise
            return list(found.get(path, found.get("runs", [])))
        got = self._call(what, run_id)
        return [json.loads(json.dumps(x.to_json(), default=str)) for x in got]

    def events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events so far (at most a second's wait)."""
        events: list[dict[str, Any]] = []
        if self.via == "async":
            self.via = "client"  # AsyncClient.events is an async iterator: the Client's here
            try:
                return self.events(run_id)
            finally:
                self.via = "async"
        if self.via == "http":
            return []  # a server-sent event stream: read by the pages, not here
        from cairn.core.errors import CairnError

        try:
            for event in self._call("events", run_id, timeout=1.0):
                events.append({"kind": event.kind, "id": event.id})
                if len(events) >= 500:
                    break
        except CairnError as exc:  # raised as the stream is read
            raise Refused(type(exc).__name__, str(exc)) from exc
        return events
