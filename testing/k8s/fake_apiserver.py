#!/usr/bin/python3
"""A fake Kubernetes API server for the Kubernetes backend's tests.

It speaks the core/v1 Pods API (and Secrets, networking.k8s.io/v1 NetworkPolicies) the
way the real API server answers: resourceVersions from one counter, Status
objects for errors (409 AlreadyExists / Conflict, 404 NotFound, 410 Gone,
422 Invalid, 401, 403), LIST with labelSelector, WATCH as JSON lines of
{type, object} with BOOKMARK events and an ERROR event with code 410 for a
resourceVersion older than the kept history, PATCH with a
metadata.resourceVersion precondition, DELETE with gracePeriodSeconds, and
GET .../log with follow/tailLines/limitBytes.

Tests drive it through /_fake/* (no auth): injected latency, scripted status
transitions (Running with podIP + Ready, Failed with OOMKilled 137, Succeeded),
forced rejections, history compaction, and a request log to count API writes.

With ``/_fake/config {"kubelet": {"bundles": {REF: DIR}}}`` it is also a
kubelet (`FakeKubelet`): each Pod created runs for real, its task container's
command under bubblewrap with the bundle mapped from the Pod's bundle image
reference to a local bundle directory, and reaches Running/Ready once its
health port accepts connections.

Usage: fake_apiserver.py --token TOKEN [--port 0] [--port-file PATH]
Prints {"port": N} as its first stdout line once it listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Optional

from aiohttp import web

DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def status_obj(code: int, reason: str, message: str, details: Optional[dict] = None) -> dict:
    """A metav1.Status as the API server sends it with an error."""
    out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code}
    if details:
        out["details"] = details
    return out


def status_response(code: int, reason: str, message: str, details: Optional[dict] = None) -> web.Response:
    return web.json_response(status_obj(code, reason, message, details), status=code)


def match_selector(labels: dict, selector: str) -> bool:
    """labelSelector terms: k=v, k==v, k!=v, k, !k, k in (a,b), k notin (a,b)."""
    if not selector:
        return True
    terms = re.findall(r"[^,(]+(?:\([^)]*\))?", selector)
    for term in (t.strip() for t in terms):
        if not term:
            continue
        m = re.match(r"^(\S+)\s+(in|notin)\s+\((.*)\)$", term)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            has = labels.get(m.group(1)) in values
            if (m.group(2) == "in") != has:
                return False
        elif "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    out = dict(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


class Kind:
    """One resource kind's objects and event history."""

    def __init__(self, kind: str, api_version: str, plural: str) -> None:
        self.kind = kind
        self.api_version = api_version
        self.plural = plural
        self.objects: dict[tuple[str, str], dict] = {}
        self.history: list[tuple[int, str, dict]] = []  # (rv, type, object)
        self.watchers: set[asyncio.Queue] = set()
        self.compacted_rv = 0  # watches from below this get 410


class FakeKubelet:
    """Runs the Pods of a `FakeApiServer` for real on this machine, as one
    node would (loopback only, bounded, no container runtime):

    - the Pod's IP is a loopback address of its own (127.0.0.2, .3, ...):
      a Pod network gives each Pod its address, so every Pod can bind the
      same rendered ports; ``0.0.0.0:`` in the task container's args and env
      becomes ``<pod ip>:`` (the one deviation from the rendered Pod);
    - the bundle (the init container's image, or the image volume's
      reference) maps through ``bundles`` to a local directory holding
      ``nix/``, mounted read-only at ``/nix``; an unknown reference fails
      the Pod (``ErrImagePull``, as a kubelet that cannot pull);
    - the task image is this machine's ``/usr`` and ``/etc``, read-only (a
      bundle brings everything it runs);
    - the admin Secret (``sbx-<id>-admin``) is waited for, as a kubelet
      waits for a non-optional secret volume, and written 0400 at
      ``/run/agentix-admin``; ``/run/agentix`` and ``/tmp`` are tmpfs;
    - the command runs under ``bwrap`` (new PID namespace, dies with this
      process); its output is the Pod's log; Running + Ready once the
      ``--health-listen`` port accepts a connection; its exit ends the Pod
      (Succeeded for 0, else Failed with the exit code); deleting the Pod
      sends SIGTERM, then SIGKILL after the grace period.
    """

    def __init__(self, server: "FakeApiServer", bundles: dict, bwrap: str = "bwrap") -> None:
        self.server = server
        self.bundles = dict(bundles)
        self.bwrap = shutil.which(bwrap) or bwrap
        self.next_ip = 1
        self.procs: dict[str, asyncio.subprocess.Process] = {}  # by Pod uid
        self.dirs: dict[str, str] = {}
        self.started = 0

    def bundle_dir(self, pod: dict) -> Optional[str]:
        spec = pod["spec"]
        refs = [c.get("image", "") for c in spec.get("initContainers") or []]
        refs += [(v.get("image") or {}).get("reference", "") for v in spec.get("volumes") or []]
        for ref in filter(None, refs):
            for key in (ref, ref.split("@", 1)[0]):
                if key in self.bundles:
                    return self.bundles[key]
        return None

    async def secret_token(self, ns: str, pod: dict, uid: str, timeout: float = 30.0) -> Optional[bytes]:
        names = [v["secret"]["secretName"] for v in pod["spec"].get("volumes") or [] if v.get("secret")]
        if not names:
            return None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            cur = self.server.pods.objects.get((ns, pod["metadata"]["name"]))
            if cur is None or cur["metadata"]["uid"] != uid:
                return None
            secret = self.server.secrets.objects.get((ns, names[0]))
            if secret is not None:
                data = secret.get("data") or {}
                return base64.b64decode(next(iter(data.values()), ""))
            await asyncio.sleep(0.01)
        return None

    def fail(self, pod: dict, reason: str, code: int, message: str = "") -> None:
        phase = "Succeeded" if code == 0 else "Failed"
        pod["status"]["phase"] = phase
        if message:
            pod["status"]["message"] = message
        pod["status"]["conditions"] = [c for c in pod["status"].get("conditions", [])
                                       if c["type"] != "Ready"] + [{"type": "Ready", "status": "False"}]
        pod["status"]["containerStatuses"] = [
            {"name": c["name"], "ready": False, "restartCount": 0,
             "state": {"terminated": {"exitCode": code, "reason": reason}}}
            for c in pod["spec"]["containers"]]
        self.server.store(self.server.pods, pod, "MODIFIED")

    async def run(self, ns: str, name: str, uid: str) -> None:
        pod = self.server.pods.objects.get((ns, name))
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        bundle = self.bundle_dir(pod)
        if bundle is None:
            self.fail(pod, "ErrImagePull", 1, "fake kubelet: no local bundle for this Pod's bundle image")
            return
        token = await self.secret_token(ns, pod, uid)
        pod = self.server.pods.objects.get((ns, name))
        if pod is None or pod["metadata"]["uid"] != uid or "deletionTimestamp" in pod["metadata"]:
            return
        self.next_ip += 1
        ip = f"127.0.0.{self.next_ip}"
        work = tempfile.mkdtemp(prefix="fk-")
        self.dirs[uid] = work
        task = pod["spec"]["containers"][0]
        argv = [a.replace("0.0.0.0:", f"{ip}:") for a in task.get("command", []) + task.get("args", [])]
        env = {e["name"]: e.get("value", "").replace("0.0.0.0:", f"{ip}:") for e in task.get("env", [])}
        health = None
        if "--health-listen" in argv:
            health = int(argv[argv.index("--health-listen") + 1].rsplit(":", 1)[1])
        cmd = [self.bwrap, "--die-with-parent", "--unshare-pid", "--new-session",
               "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for link in ("bin", "lib", "lib64", "sbin"):
            if os.path.islink(f"/{link}"):
                cmd += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
        cmd += ["--ro-bind", os.path.join(bundle, "nix"), "/nix", "--proc", "/proc", "--dev", "/dev",
                "--tmpfs", "/tmp", "--tmpfs", "/run", "--dir", "/run/agentix", "--clearenv",
                "--hostname", name, "--unshare-uts"]
        if token is not None:
            admin = os.path.join(work, "admin")
            os.mkdir(admin, 0o700)
            path = os.path.join(admin, "admin-token")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            os.write(fd, token)
            os.close(fd)
            cmd += ["--ro-bind", admin, "/run/agentix-admin"]
        for key, value in env.items():
            cmd += ["--setenv", key, value]
        cmd += ["--setenv", "PATH", "/usr/bin:/bin", "--remount-ro", "/", "--", *argv]
        proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT)
        self.procs[uid] = proc
        self.started += 1
        loop = asyncio.get_running_loop()
        loop.create_task(self.pump(ns, name, uid, proc))
        loop.create_task(self.ready_when_listening(ns, name, uid, ip, health, proc))

    async def pump(self, ns: str, name: str, uid: str, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            cur = self.server.pods.objects.get((ns, name))
            if cur is not None and cur["metadata"]["uid"] == uid:
                self.server.logs.setdefault((ns, name), bytearray()).extend(chunk)
                for event in list(self.server.log_waiters):
                    event.set()
        code = await proc.wait()
        self.procs.pop(uid, None)
        shutil.rmtree(self.dirs.pop(uid, ""), ignore_errors=True)
        cur = self.server.pods.objects.get((ns, name))
        if cur is not None and cur["metadata"]["uid"] == uid and "deletionTimestamp" not in cur["metadata"]:
            status = code if code >= 0 else 128 - code
            self.fail(cur, "Completed" if status == 0 else "Error", status)

    async def ready_when_listening(self, ns: str, name: str, uid: str, ip: str, port: Optional[int],
                                   proc: asyncio.subprocess.Process) -> None:
        while proc.returncode is None:
            if port is not None:
                try:
                    _, writer = await asyncio.open_connection(ip, port)
                    writer.close()
                    break
                except OSError:
                    pass
            await asyncio.sleep(0.02)
        cur = self.server.pods.objects.get((ns, name))
        if proc.returncode is None and cur is not None and cur["metadata"]["uid"] == uid:
            self.server.set_running(cur, ip)

    def stop(self, uid: str, grace_s: float) -> None:
        proc = self.procs.get(uid)
        if proc is None or proc.returncode is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            return

        async def kill_later() -> None:
            try:
                await asyncio.wait_for(proc.wait(), timeout=max(grace_s, 0.0))
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()

        asyncio.get_running_loop().create_task(kill_later())

    def stop_all(self) -> None:
        for proc in list(self.procs.values()):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()


class FakeApiServer:
    def __init__(self, token: str) -> None:
        self.token = token
        self.rv = 1000
        self.latency_s = 0.0
        self.auto_ready: Optional[dict] = None  # {"pod_ip" ("auto": one per Pod), "delay_ms"}
        self.ips_given = 0
        self.reject_create: Optional[str] = None  # 422 message for pod creates
        self.forbid: set[str] = set()  # verbs answered 403
        self.bookmark_interval_s = 1.0
        self.max_grace_s = 0.2  # graceful deletes end after min(grace, this)
        self.requests: list[dict] = []
        self.frozen = False  # watches hold their events (a slow watch)
        self.held: list[tuple[Kind, str, dict]] = []
        self.logs: dict[tuple[str, str], bytearray] = {}
        self.log_waiters: set[asyncio.Event] = set()
        self.pods = Kind("Pod", "v1", "pods")
        self.netpols = Kind("NetworkPolicy", "networking.k8s.io/v1", "networkpolicies")
        self.secrets = Kind("Secret", "v1", "secrets")
        self.kubelet: Optional[FakeKubelet] = None

    # ------------------------------------------------------------ plumbing
    def next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def emit(self, kind: Kind, etype: str, obj: dict) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        snapshot = copy.deepcopy(obj)
        kind.history.append((rv, etype, snapshot))
        if self.frozen:
            self.held.append((kind, etype, snapshot))
            return
        for q in list(kind.watchers):
            q.put_nowait((etype, snapshot))

    def store(self, kind: Kind, obj: dict, etype: str) -> dict:
        obj["metadata"]["resourceVersion"] = self.next_rv()
        md = obj["metadata"]
        kind.objects[(md["namespace"], md["name"])] = obj
        self.emit(kind, etype, obj)
        return obj

    def remove(self, kind: Kind, ns: str, name: str) -> Optional[dict]:
        obj = kind.objects.pop((ns, name), None)
        if obj is not None and kind is self.pods and self.kubelet is not None:
            self.kubelet.stop(obj["metadata"]["uid"], 0)
        if obj is not None:
            obj["metadata"]["resourceVersion"] = self.next_rv()
            self.emit(kind, "DELETED", obj)
            self.logs.pop((ns, name), None)
            # The garbage collector: what the object owned goes with it.
            uid = obj["metadata"].get("uid")
            for other in (self.secrets, self.netpols):
                for (ons, oname), o in list(other.objects.items()):
                    owners = o["metadata"].get("ownerReferences") or []
                    if ons == ns and any(ref.get("uid") == uid for ref in owners):
                        self.remove(other, ons, oname)
        return obj

    def check_auth(self, request: web.Request) -> Optional[web.Response]:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return status_response(401, "Unauthorized", "Unauthorized")
        return None

    def forbidden(self, verb: str, plural: str, ns: str) -> Optional[web.Response]:
        if verb not in self.forbid:
            return None
        return status_response(
            403, "Forbidden",
            f'{plural} is forbidden: User "system:serviceaccount:{ns}:agentix-providerd" cannot '
            f'{verb} resource "{plural}" in API group "" in the namespace "{ns}"',
            {"kind": plural})

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        if request.path.startswith("/_fake/"):
            return await handler(request)
        self.requests.append({"method": request.method, "path": request.path,
                              "query": dict(request.query), "time": time.time(),
                              "write": request.method in WRITE_METHODS})
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        denied = self.check_auth(request)
        if denied is not None:
            return denied
        return await handler(request)

    # ------------------------------------------------------------ generic CRUD
    def list_response(self, kind: Kind, ns: str, selector: str) -> dict:
        items = [copy.deepcopy(o) for (ons, _), o in sorted(kind.objects.items())
                 if ons == ns and match_selector(o["metadata"].get("labels", {}), selector)]
        return {"kind": kind.kind + "List", "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(self.rv)}, "items": items}

    async def watch(self, request: web.Request, kind: Kind, ns: str) -> web.StreamResponse:
        selector = request.query.get("labelSelector", "")
        since = int(request.query.get("resourceVersion") or 0)
        bookmarks = request.query.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(request.query.get("timeoutSeconds") or 3600)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await resp.prepare(request)
        except ConnectionResetError:  # the client went away already
            return resp

        async def send(etype: str, obj: dict) -> None:
            await resp.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")

        if since and since < kind.compacted_rv:
            await send("ERROR", status_obj(
                410, "Expired", f"too old resource version: {since} ({kind.compacted_rv})"))
            return resp
        queue: asyncio.Queue = asyncio.Queue()
        kind.watchers.add(queue)
        try:
            def wanted(obj: dict) -> bool:
                md = obj["metadata"]
                return md["namespace"] == ns and match_selector(md.get("labels", {}), selector)

            if since:
                for rv, etype, obj in list(kind.history):
                    if rv > since and wanted(obj):
                        await send(etype, obj)
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                wait = min(self.bookmark_interval_s, end - time.monotonic())
                try:
                    etype, obj = await asyncio.wait_for(queue.get(), timeout=max(wait, 0.01))
                except asyncio.TimeoutError:
                    if bookmarks and not self.frozen:  # a held event is not yet "seen"
                        await send("BOOKMARK", {"kind": kind.kind, "apiVersion": kind.api_version,
                                                "metadata": {"resourceVersion": str(self.rv)}})
                    continue
                if etype == "__close__":
                    break
                if wanted(obj):
                    await send(etype, obj)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            kind.watchers.discard(queue)
        return resp

    def validate_pod(self, pod: dict, ns: str) -> Optional[web.Response]:
        name = pod.get("metadata", {}).get("name", "")
        causes = []
        if not name:
            causes.append("metadata.name: Required value: name or generateName is required")
        elif not DNS1123.match(name) or len(name) > 253:
            causes.append(f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain '
                          "must consist of lower case alphanumeric characters, '-' or '.'")
        containers = pod.get("spec", {}).get("containers") or []
        if not containers:
            causes.append("spec.containers: Required value")
        for i, c in enumerate(containers):
            if not c.get("image"):
                causes.append(f"spec.containers[{i}].image: Required value")
        if self.reject_create:
            causes.append(self.reject_create)
        if not causes:
            return None
        return status_response(422, "Invalid", f'Pod "{name}" is invalid: ' + ", ".join(causes),
                               {"name": name, "kind": "pods"})

    # ------------------------------------------------------------ pods
    async def pods_collection(self, request: web.Request) -> web.StreamResponse:
        return await self.collection(request, self.pods)

    async def netpols_collection(self, request: web.Request) -> web.StreamResponse:
        return await self.collection(request, self.netpols)

    async def secrets_collection(self, request: web.Request) -> web.StreamResponse:
        return await self.collection(request, self.secrets)

    async def secret_item(self, request: web.Request) -> web.Response:
        return await self.item(request, self.secrets)

    async def collection(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        ns = request.match_info["ns"]
        if request.method == "GET":
            verb = "watch" if request.query.get("watch") in ("1", "true") else "list"
            if (denied := self.forbidden(verb, kind.plural, ns)) is not None:
                return denied
            if verb == "watch":
                return await self.watch(request, kind, ns)
            return web.json_response(self.list_response(kind, ns, request.query.get("labelSelector", "")))
        if (denied := self.forbidden("create", kind.plural, ns)) is not None:
            return denied
        try:
            obj = await request.json()
        except ValueError:
            return status_response(400, "BadRequest", "the body of the request was in an unknown format")
        if kind is self.pods and (bad := self.validate_pod(obj, ns)) is not None:
            return bad
        md = obj.setdefault("metadata", {})
        name = md.get("name", "")
        if (ns, name) in kind.objects:
            return status_response(409, "AlreadyExists", f'{kind.plural} "{name}" already exists',
                                   {"name": name, "kind": kind.plural})
        md["namespace"] = ns
        md["uid"] = str(uuid.uuid4())
        md["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        obj["kind"] = kind.kind
        obj["apiVersion"] = kind.api_version
        if kind is self.pods:
            obj["status"] = {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "True"}]}
        self.store(kind, obj, "ADDED")
        if kind is self.pods and self.kubelet is not None:
            asyncio.get_running_loop().create_task(self.kubelet.run(ns, name, md["uid"]))
        elif kind is self.pods and self.auto_ready is not None:
            asyncio.get_running_loop().create_task(self.auto_run(ns, name, md["uid"]))
        return web.json_response(obj, status=201)

    async def auto_run(self, ns: str, name: str, uid: str) -> None:
        await asyncio.sleep(self.auto_ready.get("delay_ms", 0) / 1000)
        pod = self.pods.objects.get((ns, name))
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        ip = self.auto_ready.get("pod_ip", "auto")
        if ip == "auto":  # one address per Pod, as a cluster's Pod network gives
            self.ips_given += 1
            ip = f"10.244.{self.ips_given // 250}.{self.ips_given % 250 + 1}"
        self.set_running(pod, ip)

    def set_running(self, pod: dict, pod_ip: str) -> None:
        pod["spec"]["nodeName"] = "fake-node"
        pod["status"] = {
            "phase": "Running", "podIP": pod_ip, "podIPs": [{"ip": pod_ip}], "hostIP": "10.0.0.1",
            "conditions": [{"type": "PodScheduled", "status": "True"},
                           {"type": "Initialized", "status": "True"},
                           {"type": "ContainersReady", "status": "True"},
                           {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0,
                                   "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
                                  for c in pod["spec"]["containers"]]}
        self.store(self.pods, pod, "MODIFIED")

    def get_object(self, kind: Kind, request: web.Request) -> tuple[str, str, Optional[dict]]:
        ns, name = request.match_info["ns"], request.match_info["name"]
        return ns, name, kind.objects.get((ns, name))

    def not_found(self, kind: Kind, name: str) -> web.Response:
        return status_response(404, "NotFound", f'{kind.plural} "{name}" not found',
                               {"name": name, "kind": kind.plural})

    async def pod_item(self, request: web.Request) -> web.Response:
        return await self.item(request, self.pods)

    async def netpol_item(self, request: web.Request) -> web.Response:
        return await self.item(request, self.netpols)

    async def item(self, request: web.Request, kind: Kind) -> web.Response:
        ns, name, obj = self.get_object(kind, request)
        verb = {"GET": "get", "DELETE": "delete", "PATCH": "patch"}.get(request.method, "")
        if (denied := self.forbidden(verb, kind.plural, ns)) is not None:
            return denied
        if obj is None:
            return self.not_found(kind, name)
        if request.method == "GET":
            return web.json_response(obj)
        if request.method == "DELETE":
            grace = request.query.get("gracePeriodSeconds")
            if grace is None and request.can_read_body:
                try:
                    grace = (await request.json()).get("gracePeriodSeconds")
                except ValueError:
                    grace = None
            grace_s = float(grace) if grace is not None else 30.0
            if grace_s <= 0 or kind is not self.pods:
                return web.json_response(self.remove(kind, ns, name))
            if "deletionTimestamp" not in obj["metadata"]:
                obj["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                obj["metadata"]["deletionGracePeriodSeconds"] = int(grace_s)
                self.store(kind, obj, "MODIFIED")
                uid = obj["metadata"]["uid"]
                if self.kubelet is not None:
                    self.kubelet.stop(uid, grace_s)

                async def finish() -> None:
                    await asyncio.sleep(min(grace_s, self.max_grace_s))
                    cur = kind.objects.get((ns, name))
                    if cur is not None and cur["metadata"]["uid"] == uid:
                        self.remove(kind, ns, name)

                asyncio.get_running_loop().create_task(finish())
            return web.json_response(obj)
        # PATCH
        ctype = request.content_type
        if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return status_response(415, "UnsupportedMediaType",
                                   f"the body of the request was in an unknown format - accepted "
                                   f"media types include: application/merge-patch+json, "
                                   f"application/strategic-merge-patch+json; got {ctype}")
        try:
            patch = await request.json()
        except ValueError:
            return status_response(400, "BadRequest", "the body of the request was in an unknown format")
        want_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if want_rv is not None and want_rv != obj["metadata"]["resourceVersion"]:
            return status_response(
                409, "Conflict",
                f'Operation cannot be fulfilled on {kind.plural} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                {"name": name, "kind": kind.plural})
        patched = merge_patch(obj, patch)
        for key in ("uid", "namespace", "name", "creationTimestamp"):
            patched["metadata"][key] = obj["metadata"][key]
        if kind is self.pods and patched.get("spec", {}).get("containers") != obj["spec"]["containers"]:
            return status_response(422, "Invalid", f'Pod "{name}" is invalid: spec: Forbidden: pod '
                                   "updates may not change fields other than image and "
                                   "activeDeadlineSeconds", {"name": name, "kind": "pods"})
        return web.json_response(self.store(kind, patched, "MODIFIED"))

    async def pod_log(self, request: web.Request) -> web.StreamResponse:
        ns, name, pod = self.get_object(self.pods, request)
        if pod is None:
            return self.not_found(self.pods, name)
        data = bytes(self.logs.get((ns, name), b""))
        tail = request.query.get("tailLines")
        if tail is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(tail):]) if int(tail) > 0 else b""
        limit = request.query.get("limitBytes")
        if limit is not None:
            data = data[: int(limit)]
        if request.query.get("follow") not in ("true", "1"):
            return web.Response(body=data, content_type="text/plain")
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        await resp.write(data)
        sent = len(self.logs.get((ns, name), b""))
        uid = pod["metadata"]["uid"]
        while True:
            cur = self.pods.objects.get((ns, name))
            buf = self.logs.get((ns, name), b"")
            if len(buf) > sent:
                await resp.write(bytes(buf[sent:]))
                sent = len(buf)
            if cur is None or cur["metadata"]["uid"] != uid or \
                    cur["status"].get("phase") in ("Succeeded", "Failed"):
                break
            event = asyncio.Event()
            self.log_waiters.add(event)
            try:
                await asyncio.wait_for(event.wait(), timeout=0.2)
            except asyncio.TimeoutError:
                pass
            finally:
                self.log_waiters.discard(event)
        return resp

    # ------------------------------------------------------------ test control
    async def fake_control(self, request: web.Request) -> web.Response:
        op = request.match_info["op"]
        body = await request.json() if request.can_read_body else {}
        if op == "requests":
            if request.method == "DELETE":
                self.requests.clear()
            return web.json_response(self.requests)
        if op == "config":
            if "latency_ms" in body:
                self.latency_s = body["latency_ms"] / 1000
            if "auto_ready" in body:
                self.auto_ready = body["auto_ready"]
            if "reject_create" in body:
                self.reject_create = body["reject_create"]
            if "forbid" in body:
                self.forbid = set(body["forbid"])
            if "kubelet" in body:
                if self.kubelet is not None:
                    self.kubelet.stop_all()
                self.kubelet = FakeKubelet(self, **body["kubelet"]) if body["kubelet"] else None
            if "max_grace_ms" in body:  # how long a graceful delete may take at most
                self.max_grace_s = body["max_grace_ms"] / 1000
            if "bookmark_interval_ms" in body:
                self.bookmark_interval_s = body["bookmark_interval_ms"] / 1000
            return web.json_response({"ok": True})
        if op == "compact":
            # Forget the history: watches from an older rv now get 410.
            for kind in (self.pods, self.netpols, self.secrets):
                kind.history.clear()
                kind.compacted_rv = self.rv + 1
            self.rv += 1
            return web.json_response({"rv": self.rv})
        if op == "freeze":
            self.frozen = True
            return web.json_response({"ok": True})
        if op == "thaw":
            self.frozen = False
            held, self.held = self.held, []
            for kind, etype, obj in held:
                for q in list(kind.watchers):
                    q.put_nowait((etype, obj))
            return web.json_response({"ok": True})
        if op == "drop_watches":
            for q in list(self.pods.watchers):
                q.put_nowait(("__close__", {"metadata": {"namespace": "", "labels": {}}}))
            return web.json_response({"ok": True})
        if op == "pods":
            return web.json_response([o for o in self.pods.objects.values()])
        if op == "kubelet":
            kubelet = self.kubelet
            return web.json_response({"running": len(kubelet.procs) if kubelet else 0,
                                      "started": kubelet.started if kubelet else 0})
        if op == "netpols":
            return web.json_response([o for o in self.netpols.objects.values()])
        if op == "secrets":
            return web.json_response([o for o in self.secrets.objects.values()])
        ns, name = body.get("namespace", "default"), body.get("name", "")
        pod = self.pods.objects.get((ns, name))
        if pod is None:
            return web.json_response({"error": "no such pod"}, status=404)
        if op == "run":
            self.set_running(pod, body.get("pod_ip", "127.0.0.1"))
        elif op == "fail":
            reason = body.get("reason", "OOMKilled")
            code = body.get("exit_code", 137)
            phase = "Succeeded" if code == 0 and reason == "Completed" else "Failed"
            pod["status"]["phase"] = phase
            pod["status"]["conditions"] = [c for c in pod["status"].get("conditions", [])
                                           if c["type"] != "Ready"] + [
                {"type": "Ready", "status": "False"}]
            pod["status"]["containerStatuses"] = [
                {"name": c["name"], "ready": False, "restartCount": 0,
                 "state": {"terminated": {"exitCode": code, "reason": reason}}}
                for c in pod["spec"]["containers"]]
            self.store(self.pods, pod, "MODIFIED")
        elif op == "label":
            # An outside write (another client): bumps the resourceVersion.
            pod["metadata"].setdefault("labels", {}).update(body.get("labels", {}))
            self.store(self.pods, pod, "MODIFIED")
        elif op == "log":
            self.logs.setdefault((ns, name), bytearray()).extend(body.get("data", "").encode())
            for event in list(self.log_waiters):
                event.set()
        elif op == "vanish":
            self.remove(self.pods, ns, name)
        else:
            return web.json_response({"error": f"unknown op {op}"}, status=404)
        return web.json_response(self.pods.objects.get((ns, name)) or {})

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.middleware])
        r = app.router
        r.add_route("*", "/_fake/{op}", self.fake_control)
        r.add_route("GET", "/api/v1/namespaces/{ns}/pods", self.pods_collection)
        r.add_route("POST", "/api/v1/namespaces/{ns}/pods", self.pods_collection)
        r.add_route("GET", "/api/v1/namespaces/{ns}/pods/{name}/log", self.pod_log)
        for method in ("GET", "DELETE", "PATCH"):
            r.add_route(method, "/api/v1/namespaces/{ns}/pods/{name}", self.pod_item)
            r.add_route(method, "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}",
                        self.netpol_item)
        r.add_route("GET", "/api/v1/namespaces/{ns}/secrets", self.secrets_collection)
        r.add_route("POST", "/api/v1/namespaces/{ns}/secrets", self.secrets_collection)
        for method in ("GET", "DELETE"):
            r.add_route(method, "/api/v1/namespaces/{ns}/secrets/{name}", self.secret_item)
        r.add_route("GET", "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
                    self.netpols_collection)
        r.add_route("POST", "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
                    self.netpols_collection)
        r.add_route("GET", "/version", self.version)
        return app

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake"})


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--token", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=0)
    parser.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate")
    parser.add_argument("--tls-key", help="the key of --tls-cert")
    args = parser.parse_args()
    ssl_context = None
    if args.tls_cert:
        import ssl
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(args.tls_cert, args.tls_key)
    server = FakeApiServer(args.token)
    server.latency_s = args.latency_ms / 1000
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, ssl_context=ssl_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(json.dumps({"port": port}), flush=True)
    # Ends with its parent: stdin closes when the test process goes away.
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def wait_stdin() -> None:
        while sys.stdin.buffer.read(4096):
            pass
        loop.call_soon_threadsafe(done.set)

    threading.Thread(target=wait_stdin, daemon=True).start()
    await done.wait()
    if server.kubelet is not None:
        server.kubelet.stop_all()
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
