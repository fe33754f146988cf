"""A real single-node Kubernetes on this host, for installing the chart as a user would
(tests/deploy/test_k8s.py): etcd, the API server, controller manager and scheduler, containerd
with the CNI bridge, a kubelet, kube-proxy and CoreDNS run as host processes (the binaries
`make k8s-deps` builds); images are built locally and imported into containerd, since no
registry is reachable. The node's address is one of its own on the loopback interface, so
nothing it binds collides with the host's services. Needs root (the kubelet and containerd do)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rollstream.dev.processes import ProcessGroup
from tests.helpers.api_helpers import wait_until
from tests.helpers.helm_helpers import ROOT

K8S_DIR = ROOT / ".rollstream" / "k8s"
BIN = K8S_DIR / "bin"
COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
            "kube-proxy", "kubectl", "keda-operator", "keda-adapter", "coredns")
NODE = "rollstream-node"
NODE_IP = "10.250.0.1"  # added to the loopback interface while the cluster runs
BRIDGE = "rs-cni0"
POD_SUBNET = "10.244.0.0/24"
SERVICE_RANGE = "10.96.0.0/16"
UNROUTED = "KUBE-ROLLSTREAM-UNROUTED"  # iptables: Service addresses no rule translated
API_SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service: the first address of the range
API_PORT = 6443
BASE_IMAGE = "rollstream/base:bookworm"
SET_UP = "kubernetes set-up times (s)"  # the session summary's line (tests/conftest.py)
# Images the cluster runs, all built locally (scripts/local-images.sh and below).
APP_IMAGE, KAFKA_IMAGE = "rollstream/app:local", "rollstream/kafka:local"
PAUSE_IMAGE, KEDA_IMAGE = "rollstream/pause:local", "rollstream/keda:local"
# The pod sandbox's process: any image whose entrypoint never exits serves.
PAUSE_DOCKERFILE = f"FROM {BASE_IMAGE}\nENTRYPOINT [\"sleep\", \"infinity\"]\n"
# KEDA's commands where its manifests (config/) run them, as a non-root user they require.
KEDA_DOCKERFILE = (f"FROM {BASE_IMAGE}\nCOPY keda-operator /keda\nCOPY keda-adapter /keda-adapter\n"
                   "USER 1000:1000\n")


def missing() -> str | None:
    """Why the cluster cannot start here, or None."""
    if os.geteuid() != 0:
        return "the kubelet and containerd need root"
    absent = [c for c in COMMANDS if not (BIN / c).exists()]
    if absent:
        return f"not built: {', '.join(absent)} (make k8s-deps)"
    tools = [t for t in ("etcd", "containerd", "runc", "ctr", "iptables", "ip", "openssl", "docker")
             if shutil.which(t) is None]
    if not Path("/usr/lib/cni/bridge").exists():
        tools.append("the CNI plugins")
    if tools:
        return f"missing {', '.join(tools)} (make k8s-deps and make deps, as root)"
    images = [i for i in (BASE_IMAGE, APP_IMAGE, KAFKA_IMAGE)
              if subprocess.run(["docker", "image", "inspect", i], capture_output=True).returncode]
    if images:
        return f"no local image {', '.join(images)} (make images, with a Docker engine)"
    return None


def _run(*argv: str | Path, input: str | bytes | None = None, timeout: float = 120) -> str:
    result = subprocess.run([str(a) for a in argv], input=input, capture_output=True,
                            timeout=timeout, text=not isinstance(input, bytes))
    if result.returncode:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({result.returncode}): "
                           f"{result.stderr!s:.2000}")
    return str(result.stdout)


class Certificates:
    """A CA and the certificates the cluster's parts present, made with openssl."""

    def __init__(self, folder: Path) -> None:
        self.dir = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.ca, self.ca_key = folder / "ca.crt", folder / "ca.key"
        _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=rollstream-k8s-ca", "-keyout", self.ca_key, "-out", self.ca)
        # The service accounts' token signing key.
        self.sa_key, self.sa_pub = folder / "sa.key", folder / "sa.pub"
        _run("openssl", "genrsa", "-out", self.sa_key, "2048")
        _run("openssl", "rsa", "-in", self.sa_key, "-pubout", "-out", self.sa_pub)

    def issue(self, name: str, subject: str, *, server: bool = False) -> tuple[Path, Path]:
        """NAME.crt and NAME.key signed by the CA: a client certificate, or a serving one for
        the API server's names and addresses."""
        crt, key, csr, ext = (self.dir / f"{name}.{s}" for s in ("crt", "key", "csr", "ext"))
        _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
             "-keyout", key, "-out", csr)
        usage = "serverAuth,clientAuth" if server else "clientAuth"
        lines = [f"extendedKeyUsage={usage}"]
        if server:
            names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                     "kubernetes.default.svc.cluster.local", "localhost", NODE]
            addresses = ["127.0.0.1", NODE_IP, API_SERVICE_IP]
            lines.append("subjectAltName=" + ",".join(
                [f"DNS:{n}" for n in names] + [f"IP:{a}" for a in addresses]))
        ext.write_text("\n".join(lines) + "\n")
        _run("openssl", "x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key,
             "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", crt)
        return crt, key


class Cluster:
    """The node and its control plane; `start()` brings it up, `stop()` takes all of it down
    (the pods' containers, mounts, network and iptables rules included)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs = ProcessGroup(work / "logs")
        self.kubeconfig = work / "admin.kubeconfig"
        self.socket = work / "containerd.sock"
        self.timings: dict[str, float] = {}

    # --- bring-up -------------------------------------------------------------------------
    def start(self) -> None:
        began = time.monotonic()
        self._network()
        self._certificates()
        self._control_plane()
        self._node()
        self.wait_for(self.node_ready, 180, "the node Ready")
        self.timings["cluster_s"] = round(time.monotonic() - began, 1)

    def _network(self) -> None:
        if f" {NODE_IP}/32 " not in _run("ip", "-o", "addr", "show", "dev", "lo"):
            _run("ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo")
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        # A connection to a Service's address before kube-proxy has its rule would leave by the
        # default route, where this machine's network answers any TCP connection (an HTTP 404
        # that a client's keep-alive then kept: KEDA read no lag for minutes). Refused here, it
        # is retried, as on a network where the service range leads nowhere.
        subprocess.run(["iptables", "-N", UNROUTED], capture_output=True)  # a crashed run's
        _run("iptables", "-F", UNROUTED)
        _run("iptables", "-A", UNROUTED, "-d", SERVICE_RANGE, "-p", "tcp", "-j", "REJECT",
             "--reject-with", "tcp-reset")
        for chain in ("FORWARD", "OUTPUT"):
            if subprocess.run(["iptables", "-C", chain, "-j", UNROUTED],
                              capture_output=True).returncode:
                _run("iptables", "-I", chain, "-j", UNROUTED)

    def _certificates(self) -> None:
        certs = self.certs = Certificates(self.work / "pki")
        self.apiserver_cert = certs.issue("apiserver", f"/CN={NODE}", server=True)
        self.admin_cert = certs.issue("admin", "/O=system:masters/CN=admin")
        self.proxy_cert = certs.issue("front-proxy", "/CN=front-proxy-client")
        crt, key = self.admin_cert
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "admin",
            "clusters": [{"name": "rollstream", "cluster": {
                "server": f"https://{NODE_IP}:{API_PORT}",
                "certificate-authority": str(certs.ca)}}],
            "users": [{"name": "admin", "user": {"client-certificate": str(crt),
                                                 "client-key": str(key)}}],
            "contexts": [{"name": "admin", "context": {"cluster": "rollstream", "user": "admin"}}],
        }))

    def _control_plane(self) -> None:
        certs, began = self.certs, time.monotonic()
        self.procs.start_program("etcd", [
            "etcd", "--name", NODE, "--data-dir", str(self.work / "etcd"),
            "--listen-client-urls", f"http://{NODE_IP}:2379",
            "--advertise-client-urls", f"http://{NODE_IP}:2379",
            "--listen-peer-urls", f"http://{NODE_IP}:2380",
            "--initial-advertise-peer-urls", f"http://{NODE_IP}:2380",
            "--initial-cluster", f"{NODE}=http://{NODE_IP}:2380"])
        server_crt, server_key = self.apiserver_cert
        admin_crt, admin_key = self.admin_cert
        proxy_crt, proxy_key = self.proxy_cert
        self.procs.start_program("kube-apiserver", [
            str(BIN / "kube-apiserver"), f"--etcd-servers=http://{NODE_IP}:2379",
            f"--bind-address={NODE_IP}", f"--advertise-address={NODE_IP}",
            f"--secure-port={API_PORT}", f"--service-cluster-ip-range={SERVICE_RANGE}",
            f"--tls-cert-file={server_crt}", f"--tls-private-key-file={server_key}",
            f"--client-ca-file={certs.ca}", f"--service-account-key-file={certs.sa_pub}",
            f"--service-account-signing-key-file={certs.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=RBAC", "--allow-privileged=true",
            f"--kubelet-client-certificate={admin_crt}", f"--kubelet-client-key={admin_key}",
            "--kubelet-preferred-address-types=InternalIP",  # the node's name resolves nowhere
            # The aggregation layer, for KEDA's external metrics API.
            f"--requestheader-client-ca-file={certs.ca}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={proxy_crt}", f"--proxy-client-key-file={proxy_key}",
            "--enable-aggregator-routing=true"])
        self.wait_for(lambda: self.kubectl("get", "--raw", "/readyz", check=False) == "ok", 120,
                      "the API server's /readyz")
        self.procs.start_program("kube-controller-manager", [
            str(BIN / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            f"--bind-address={NODE_IP}", "--leader-elect=false",
            f"--service-account-private-key-file={certs.sa_key}", f"--root-ca-file={certs.ca}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={certs.ca}", f"--cluster-signing-key-file={certs.ca_key}",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            # KEDA scales above one replica through an HPA: look every 5 s, not 15.
            "--horizontal-pod-autoscaler-sync-period=5s"])
        self.procs.start_program("kube-scheduler", [
            str(BIN / "kube-scheduler"), f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            f"--bind-address={NODE_IP}", "--leader-elect=false"])
        self.timings["control_plane_s"] = round(time.monotonic() - began, 1)

    def _node(self) -> None:
        began = time.monotonic()
        self._containerd()
        self.import_images()
        kubelet = self.work / "kubelet.json"
        kubelet.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": NODE_IP, "healthzBindAddress": NODE_IP, "readOnlyPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(self.certs.ca)}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
            "clusterDNS": [NODE_IP], "clusterDomain": "cluster.local",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            # A busy test machine's disk or memory is not the node's business here.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "podLogsDir": str(self.work / "pod-logs")}))
        self.procs.start_program("kubelet", [
            str(BIN / "kubelet"), f"--config={kubelet}", f"--kubeconfig={self.kubeconfig}",
            f"--hostname-override={NODE}", f"--node-ip={NODE_IP}",
            f"--root-dir={self.work / 'kubelet'}"])
        self.procs.start_program("kube-proxy", [
            str(BIN / "kube-proxy"), f"--kubeconfig={self.kubeconfig}",
            f"--hostname-override={NODE}", "--proxy-mode=iptables",
            "--cluster-cidr=10.244.0.0/16", f"--bind-address={NODE_IP}",
            f"--healthz-bind-address={NODE_IP}:10256", f"--metrics-bind-address={NODE_IP}:10249",
            "--conntrack-max-per-core=0"])
        corefile = self.work / "Corefile"
        corefile.write_text(
            f".:53 {{\n  bind {NODE_IP}\n  errors\n"
            f"  kubernetes cluster.local in-addr.arpa ip6.arpa {{\n"
            f"    kubeconfig {self.kubeconfig} admin\n    pods insecure\n"
            f"    fallthrough in-addr.arpa ip6.arpa\n  }}\n"
            f"  forward . /etc/resolv.conf\n  cache 5\n}}\n")
        self.procs.start_program("coredns", [str(BIN / "coredns"), "-conf", str(corefile)])
        self.timings["node_s"] = round(time.monotonic() - began, 1)

    def _containerd(self) -> None:
        cni = self.work / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-rollstream.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "rollstream", "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.work / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}}]}))
        config = self.work / "containerd.toml"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config.write_text(f"""version = 2
root = "{self.work / 'containerd'}"
state = "{self.work / 'containerd-state'}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[{cri}]
  sandbox_image = "docker.io/{PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE on these machines: lowering a score is refused, and every pod failed.
  restrict_oom_score_adj = true
[{cri}.containerd]
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{cni}"
""")
        self.procs.start_program("containerd", ["containerd", "--config", str(config)])
        self.wait_for(lambda: self.ctr("version", check=False) is not None, 60, "containerd")

    def import_images(self) -> None:
        """Build the pause and KEDA images, then import them with Rollstream's and Kafka's."""
        began = time.monotonic()
        for tag, dockerfile, context in ((PAUSE_IMAGE, PAUSE_DOCKERFILE, self.work),
                                         (KEDA_IMAGE, KEDA_DOCKERFILE, BIN)):
            _run("docker", "build", "-q", "-t", tag, "-f", "-", context,
                 input=dockerfile, timeout=300)
        archive = self.work / "images.tar"
        _run("docker", "save", "-o", archive, PAUSE_IMAGE, KEDA_IMAGE, APP_IMAGE, KAFKA_IMAGE,
             timeout=300)
        self.ctr("images", "import", str(archive), timeout=300)
        archive.unlink()
        self.timings["images_s"] = round(time.monotonic() - began, 1)

    # --- use ------------------------------------------------------------------------------
    def ctr(self, *args: str, check: bool = True, timeout: float = 60) -> str | None:
        argv = ["ctr", "--address", str(self.socket), "-n", "k8s.io", *args]
        if check:
            return _run(*argv, timeout=timeout)
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return result.stdout if result.returncode == 0 else None

    def env(self) -> dict[str, str]:
        """The environment `kubectl` and `helm` reach this cluster with."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig),
                "PATH": f"{BIN}:{os.environ['PATH']}"}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> str:
        result = subprocess.run([str(BIN / "kubectl"), *args], input=input, text=True,
                                capture_output=True, timeout=timeout, env=self.env())
        if check and result.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout.strip() if result.returncode == 0 else result.stderr.strip()

    def node_ready(self) -> bool:
        return self.kubectl("get", "node", NODE, "-o",
                            'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
                            check=False) == "True"

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Until `condition()`, failing at once if one of the cluster's processes exits."""
        wait_until(condition, what, self.procs, timeout)

    # --- take-down ------------------------------------------------------------------------
    def stop(self) -> None:
        """The kubelet first (nothing restarts pods), then every container, then the rest."""
        for name in ("kubelet", "kube-controller-manager", "kube-scheduler", "coredns"):
            if name in self.procs.procs:
                self.procs.stop(name, timeout=20)
        for task in (self.ctr("tasks", "list", "-q", check=False) or "").split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        time.sleep(1)
        self.procs.stop_all(timeout=20)
        subprocess.run([str(BIN / "kube-proxy"), "--cleanup"], capture_output=True, timeout=60)
        _remove_chains()
        subprocess.run(["pkill", "-9", "-f", f"containerd-shim.*{self.socket}"],
                       capture_output=True)
        # Pod volumes and rootfs mounts under the work folder, deepest first.
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(self.work))]
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        netns_dir = Path("/var/run/netns")
        for netns in netns_dir.glob("cni-*") if netns_dir.exists() else []:
            subprocess.run(["ip", "netns", "delete", netns.name], capture_output=True)
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
        subprocess.run(["ip", "addr", "del", f"{NODE_IP}/32", "dev", "lo"], capture_output=True)


def _remove_chains() -> None:
    """The iptables chains the kubelet made and the CNI plugin made for this network's pods
    (their sandboxes were killed, not torn down, so no CNI DEL removed them)."""
    for table in ("nat", "filter", "mangle"):
        rules = _run("iptables", "-t", table, "-S").splitlines()
        ours = {line.split()[1] for line in rules if line.startswith("-N KUBE-")}
        ours |= {line.split(" -j ")[1].split()[0] for line in rules
                 if ' -j CNI-' in line and 'name: \\"rollstream\\"' in line}
        for line in rules:  # the jumps into them, from any chain
            target = line.split(" -j ")[1].split()[0] if " -j " in line else ""
            if line.startswith("-A ") and target in ours:
                subprocess.run(["iptables", "-t", table, "-D", *shlex.split(line)[1:]],
                               capture_output=True)
        for chain in ours:
            subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True)
        for chain in ours:
            subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True)
