#!/usr/bin/env python3
"""Checks that deploy/k8s's manifests agree with each other.

kubernetes-validate checks each object against the API schema; what it cannot
see is whether the objects fit together: a --shard_count that is not the
StatefulSet's replicas, a trainer server list that misses a shard, a probe on
the wrong port or a Secret key nobody created all pass the schema and fail
only in a cluster. That is what this checks, with the facts taken from the
manifests themselves (no names are hard-coded here except the pod-index and
completion-index sources, which Kubernetes fixes).

Usage: check_manifests.py K8S_DIR [--secrets=OUT_DIR] [--self_test]
  --secrets=OUT_DIR  also check make_secrets.sh's output: its secrets.yaml in
                     place of the placeholders, the server certificate's names
                     against the addresses the trainers dial, each certificate
                     against the CA the other side verifies it with.
  --self_test        break the manifests in known ways; each must be caught.
"""

import base64
import copy
import os
import re
import subprocess
import sys
import tempfile

import yaml

POD_INDEX = "metadata.labels['apps.kubernetes.io/pod-index']"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3, "": 1}


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def load(k8s_dir):
    """Returns (objects, errors): what base/kustomization.yaml applies plus the
    example Secrets (the names the manifests mount)."""
    base = os.path.join(k8s_dir, "base")
    kustomization = load_all(os.path.join(base, "kustomization.yaml"))[0]
    listed = kustomization.get("resources", [])
    present = sorted(f for f in os.listdir(base) if f.endswith(".yaml") and f != "kustomization.yaml")
    errors = [f"base/{f} is not in base/kustomization.yaml's resources" for f in present if f not in listed]
    errors += [f"base/kustomization.yaml lists {f}, which does not exist" for f in listed if f not in present]
    objects = [o for f in present for o in load_all(os.path.join(base, f))]
    return objects + load_all(os.path.join(k8s_dir, "secrets.example.yaml")), errors


def quantity(q):
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
    return float(m.group(1)) * UNITS[m.group(2)]


def flags_of(container):
    flags = {}
    for arg in container.get("args", []):
        name, _, value = arg.lstrip("-").partition("=")
        flags[name] = value
    return flags


def field_of(container, env_name):
    """The downward-API field an env variable comes from (None: not defined)."""
    env = next((e for e in container.get("env", []) if e["name"] == env_name), {})
    return env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def resolve_port(container, port):
    """A probe's or Service's port, named or numbered, as a number."""
    if isinstance(port, int):
        return port
    return next((p["containerPort"] for p in container.get("ports", []) if p.get("name") == port), None)


def secret_content(secret, key):
    if key in secret.get("stringData", {}):
        return secret["stringData"][key].encode()
    if key in secret.get("data", {}):
        return base64.b64decode(secret["data"][key])
    return None


class Checker:
    def __init__(self, objects):
        self.errors = []
        self.by_kind = {}
        for o in objects:
            self.by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o

    def error(self, message):
        self.errors.append(message)

    def one(self, kind):
        found = list(self.by_kind.get(kind, {}).values())
        if len(found) != 1:
            raise SystemExit(f"expected exactly one {kind}, found {len(found)}")
        return found[0]

    def mounted_file(self, where, pod, container, path):
        """The (Secret, key) that `path` is in the container, or None (after an error)."""
        for mount in container.get("volumeMounts", []):
            prefix = mount["mountPath"].rstrip("/") + "/"
            if not path.startswith(prefix):
                continue
            volume = next((v for v in pod.get("volumes", []) if v["name"] == mount["name"]), {})
            if "secret" not in volume:
                self.error(f"{where}: {path} is on volume {mount['name']}, not a Secret")
                return None
            secret = self.by_kind.get("Secret", {}).get(volume["secret"]["secretName"])
            relative = path[len(prefix):]
            items = volume["secret"].get("items")
            key = relative if items is None else next(
                (i["key"] for i in items if i["path"] == relative), None)
            if secret is None or key is None or secret_content(secret, key) is None:
                self.error(f"{where}: {path} is no key of Secret {volume['secret']['secretName']}")
                return None
            return secret, key
        self.error(f"{where}: {path} is under no volume mount")
        return None

    def pvc_at(self, where, pod, container, path):
        mount = next((m for m in container.get("volumeMounts", []) if m["mountPath"] == path), None)
        volume = mount and next((v for v in pod.get("volumes", []) if v["name"] == mount["name"]), None)
        claim = volume and volume.get("persistentVolumeClaim", {}).get("claimName")
        pvc = self.by_kind.get("PersistentVolumeClaim", {}).get(claim)
        if pvc is None:
            self.error(f"{where}: {path} is not a mount of a PersistentVolumeClaim of these manifests")
        elif "ReadWriteMany" not in pvc["spec"]["accessModes"]:
            # Shards write into one checkpoint directory; a replaced trainer may land elsewhere.
            self.error(f"{where}: PersistentVolumeClaim {claim} at {path} is not ReadWriteMany")

    def pod_basics(self, where, pod):
        """What every pod of these manifests must have."""
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for name, v in volumes.items():
            if "secret" in v:
                secret = self.by_kind.get("Secret", {}).get(v["secret"]["secretName"])
                if secret is None:
                    self.error(f"{where}: volume {name}: no Secret {v['secret']['secretName']}")
                for item in v["secret"].get("items", []) if secret else []:
                    if secret_content(secret, item["key"]) is None:
                        self.error(f"{where}: volume {name}: Secret has no key {item['key']}")
            if "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] not in \
                    self.by_kind.get("PersistentVolumeClaim", {}):
                self.error(f"{where}: volume {name}: no PersistentVolumeClaim "
                           f"{v['persistentVolumeClaim']['claimName']}")
        non_root = pod.get("securityContext", {}).get("runAsNonRoot")
        for c in pod["containers"]:
            at = f"{where} container {c['name']}"
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    self.error(f"{at}: mounts volume {m['name']}, which the pod does not have")
            sc = c.get("securityContext", {})
            if not sc.get("runAsNonRoot", non_root):
                self.error(f"{at}: runAsNonRoot is not set")
            if not sc.get("readOnlyRootFilesystem"):
                self.error(f"{at}: the root filesystem is writable")
            if sc.get("allowPrivilegeEscalation", True):
                self.error(f"{at}: allowPrivilegeEscalation is not false")
            for kind in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    if resource not in c.get("resources", {}).get(kind, {}):
                        self.error(f"{at}: no {resource} {kind}")
            if c.get("imagePullPolicy") not in ("IfNotPresent", "Never"):
                self.error(f"{at}: imagePullPolicy must be IfNotPresent or Never (local images)")

    def check(self):
        sts, job = self.one("StatefulSet"), self.one("Job")
        namespaces = {o["metadata"].get("namespace") for kind, objs in self.by_kind.items()
                      if kind != "Namespace" for o in objs.values()}
        if namespaces != set(self.by_kind.get("Namespace", {})):
            self.error(f"objects are in namespaces {sorted(map(str, namespaces))}, "
                       f"the Namespace objects are {sorted(self.by_kind.get('Namespace', {}))}")

        # --- The shard servers.
        pod = sts["spec"]["template"]["spec"]
        labels = sts["spec"]["template"]["metadata"].get("labels", {})
        server = pod["containers"][0]
        flags = flags_of(server)
        replicas = sts["spec"]["replicas"]
        self.pod_basics("StatefulSet", pod)
        if flags.get("shard_count") != str(replicas):
            self.error(f"--shard_count={flags.get('shard_count')} but replicas: {replicas}")
        if flags.get("shard_index") != "$(SHARD_INDEX)" or field_of(server, "SHARD_INDEX") != POD_INDEX:
            self.error(f"--shard_index must be $(SHARD_INDEX), from the {POD_INDEX} field")
        if sts["spec"].get("podManagementPolicy") != "Parallel":
            self.error("podManagementPolicy is not Parallel")
        # (No upper bound: a checkpoint part being written at SIGTERM is
        # finished first, and large ones on slow storage need minutes.)
        if not 5 < pod.get("terminationGracePeriodSeconds", 30):
            self.error("terminationGracePeriodSeconds must exceed the server's 5 s drain")
        limits = server["resources"].get("limits", {})
        if "threads" not in flags or int(flags["threads"]) > quantity(limits.get("cpu", 0)):
            self.error("--threads must be set, at most the CPU limit (0 = every CPU of the node)")
        memory = quantity(limits.get("memory", 0))
        if "max_state_mib" not in flags or int(flags["max_state_mib"]) * 2**20 >= memory:
            self.error("--max_state_mib must be set, below the memory limit (the default is the node's)")
        ckpt = flags.get("checkpoint_dir")
        if not ckpt or flags.get("restore_from") != ckpt or flags.get("checkpoint_keep") != "3" or \
                not flags.get("checkpoint_every", "").isdigit():
            self.error("crash recovery needs --checkpoint_dir=D --checkpoint_every=N "
                       "--checkpoint_keep=3 --restore_from=D")
        else:
            self.pvc_at("StatefulSet --checkpoint_dir", pod, server, ckpt)
        if sts["spec"].get("volumeClaimTemplates"):
            self.error("volumeClaimTemplates: a checkpoint commits only where every shard's part is")

        service = self.by_kind.get("Service", {}).get(sts["spec"]["serviceName"])
        if service is None:
            self.error(f"serviceName {sts['spec']['serviceName']} is no Service here")
            return self.errors
        if service["spec"].get("clusterIP") != "None":
            self.error(f"Service {service['metadata']['name']} is not headless")
        if any(labels.get(k) != v for k, v in service["spec"]["selector"].items()):
            self.error("the headless Service's selector does not match the shard pods")
        listen_port = port_of(flags.get("listen", ":0"))
        grpc = [p for p in service["spec"]["ports"]
                if resolve_port(server, p.get("targetPort", p["port"])) == listen_port]
        if not grpc:
            self.error(f"the headless Service has no port for --listen's {listen_port}")
            return self.errors
        if grpc[0]["port"] != listen_port:
            # Headless: the names resolve to pod IPs, nothing maps ports.
            self.error(f"the headless Service's port {grpc[0]['port']} is not --listen's {listen_port}")

        metrics_port = port_of(flags.get("metrics_listen", ":0"))
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = server.get(probe, {}).get("httpGet", {})
            if resolve_port(server, get.get("port")) != metrics_port or get.get("path") != "/healthz":
                self.error(f"{probe} is not an httpGet of /healthz on --metrics_listen's port {metrics_port}")
        annotations = sts["spec"]["template"]["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") != "true" or \
                annotations.get("prometheus.io/port") != str(metrics_port):
            self.error(f"prometheus.io annotations do not scrape port {metrics_port}")

        # --- The trainers.
        tpod = job["spec"]["template"]["spec"]
        trainer = tpod["containers"][0]
        tflags = flags_of(trainer)
        self.pod_basics("Job", tpod)
        host = lambda i: f"{sts['metadata']['name']}-{i}.{service['metadata']['name']}:{listen_port}"
        expected = ",".join(host(i) for i in range(replicas))
        if tflags.get("servers") != expected:
            self.error(f"trainers' --servers={tflags.get('servers')}, expected {expected}")
        n = str(job["spec"].get("completions"))
        if job["spec"].get("completionMode") != "Indexed" or str(job["spec"].get("parallelism")) != n or \
                tflags.get("num_trainers") != n:
            self.error("the Job must be Indexed with completions = parallelism = --num_trainers")
        elif int(tflags.get("batch", 256)) % int(n):
            self.error("--batch is not a multiple of --num_trainers")
        # The Job controller defines JOB_COMPLETION_INDEX unless the manifest does.
        source = field_of(trainer, "JOB_COMPLETION_INDEX")
        if tflags.get("rank") != "$(JOB_COMPLETION_INDEX)" or source not in (None, COMPLETION_INDEX):
            self.error("--rank must be $(JOB_COMPLETION_INDEX)")
        if "backoffLimit" not in job["spec"]:
            self.error("the Job has no backoffLimit")
        if "journal_dir" not in tflags:
            self.error("the trainers keep no journal (--journal_dir)")
        else:
            self.pvc_at("Job --journal_dir", tpod, trainer, tflags["journal_dir"])

        # --- Both ends of TLS and of the token.
        def file_of(pod_, container, flag):
            """The content of the Secret key that the file flag names."""
            where = f"{container['name']} --{flag}"
            path = flags_of(container).get(flag)
            if not path:
                self.error(f"{where} is not set: TLS and tokens are not optional")
                return None
            found = self.mounted_file(where, pod_, container, path)
            return found and secret_content(*found)
        self.pairs = {
            "server_cert": file_of(pod, server, "tls_cert_file"),
            "server_key": file_of(pod, server, "tls_key_file"),
            "server_ca": file_of(pod, server, "tls_client_ca_file"),
            "trainer_cert": file_of(tpod, trainer, "tls_cert_file"),
            "trainer_key": file_of(tpod, trainer, "tls_key_file"),
            "trainer_ca": file_of(tpod, trainer, "tls_ca_file"),
            "hosts": [host(i).rsplit(":", 1)[0] for i in range(replicas)],
        }
        tokens = file_of(pod, server, "auth_token_file")
        token = file_of(tpod, trainer, "auth_token_file")
        if tokens is None or token is None or \
                f"trainer {token.decode().strip()}" not in tokens.decode().splitlines():
            self.error("the trainers' token is not a 'trainer <token>' line of the servers' token file")
        return self.errors


def openssl(*args, stdin=None):
    return subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=False)


def check_certificates(pairs):
    """The real certificates: names, purposes, chains and key pairs."""
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, content in pairs.items():
            if isinstance(content, bytes):
                with open(os.path.join(tmp, name), "wb") as f:
                    f.write(content)
        p = lambda name: os.path.join(tmp, name)
        sans = openssl("x509", "-in", p("server_cert"), "-noout", "-ext", "subjectAltName").stdout.decode()
        names = set(re.findall(r"DNS:([^,\s]+)", sans))
        for host in pairs["hosts"]:
            if host not in names:
                errors.append(f"the server certificate does not name {host} (has {sorted(names)})")
        # Each side verifies the other with its own CA file.
        for cert, ca, purpose in (("server_cert", "trainer_ca", "sslserver"),
                                  ("trainer_cert", "server_ca", "sslclient")):
            r = openssl("verify", "-CAfile", p(ca), "-purpose", purpose, p(cert))
            if r.returncode:
                errors.append(f"{cert} does not verify as {purpose} against {ca}: "
                              f"{r.stdout.decode()}{r.stderr.decode()}")
        for cert, key in (("server_cert", "server_key"), ("trainer_cert", "trainer_key")):
            a = openssl("x509", "-in", p(cert), "-noout", "-pubkey").stdout
            b = openssl("pkey", "-in", p(key), "-pubout").stdout
            if not a or a != b:
                errors.append(f"{key} is not the key of {cert}")
    return errors


def self_test(objects):
    """Each break must be reported; returns the ones that were not."""
    def find(objs, kind):
        return next(o for o in objs if o["kind"] == kind)
    sts = lambda o: find(o, "StatefulSet")["spec"]
    server = lambda o: sts(o)["template"]["spec"]["containers"][0]
    trainer = lambda o: find(o, "Job")["spec"]["template"]["spec"]["containers"][0]

    def set_arg(container, flag, value):
        kept = [a for a in container["args"] if not a.startswith(f"--{flag}=")]
        container["args"] = kept + [f"--{flag}={value}"]

    def reorder_servers(o):
        s = flags_of(trainer(o))["servers"].split(",")
        set_arg(trainer(o), "servers", ",".join(reversed(s)))

    def rename_trainer_secret(o):
        for v in find(o, "Job")["spec"]["template"]["spec"]["volumes"]:
            if "secret" in v:
                v["secret"]["secretName"] += "-typo"
                return

    def per_shard_checkpoints(o):
        pod = sts(o)["template"]["spec"]
        pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "checkpoints"]
        sts(o)["volumeClaimTemplates"] = [{"metadata": {"name": "checkpoints"}}]

    breaks = {
        "one more replica": lambda o: sts(o).update(replicas=sts(o)["replicas"] + 1),
        "servers out of order": reorder_servers,
        "servers on another port": lambda o: set_arg(
            trainer(o), "servers", flags_of(trainer(o))["servers"].replace(":50051", ":50052")),
        "liveness on another port": lambda o: server(o)["livenessProbe"]["httpGet"].update(port=9401),
        "metrics elsewhere": lambda o: set_arg(server(o), "metrics_listen", "0.0.0.0:9500"),
        "missing Secret": rename_trainer_secret,
        "token path": lambda o: set_arg(trainer(o), "auth_token_file", "/auth/tokens"),
        "per-shard checkpoints": per_shard_checkpoints,
        "no restore": lambda o: set_arg(server(o), "restore_from", "/elsewhere"),
        "fewer trainers": lambda o: set_arg(trainer(o), "num_trainers", "1"),
    }
    missed = []
    for name, brk in breaks.items():
        broken = copy.deepcopy(objects)
        brk(broken)
        if not Checker(broken).check():
            missed.append(name)
    return missed


def main(argv):
    k8s_dir = argv[1]
    objects, errors = load(k8s_dir)
    secrets_dir = next((a.split("=", 1)[1] for a in argv[2:] if a.startswith("--secrets=")), None)
    if secrets_dir:
        generated = load_all(os.path.join(secrets_dir, "secrets.yaml"))
        names = {(s["metadata"]["name"], s.get("type")) for s in generated}
        examples = {(o["metadata"]["name"], o.get("type")) for o in objects if o["kind"] == "Secret"}
        if names != examples:
            errors.append(f"make_secrets.sh writes {sorted(names)}, "
                          f"secrets.example.yaml has {sorted(examples)}")
        objects = [o for o in objects if o["kind"] != "Secret"] + generated
    checker = Checker(objects)
    errors += checker.check()
    if secrets_dir and not errors:
        errors += check_certificates(checker.pairs)
    if "--self_test" in argv:
        errors += [f"self test: breaking '{m}' went unnoticed" for m in self_test(objects)]
    for e in errors:
        print(f"check_manifests: {e}", file=sys.stderr)
    print(f"check_manifests: {len(objects)} objects, {len(errors)} problems"
          + (" (with make_secrets.sh's output)" if secrets_dir else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
