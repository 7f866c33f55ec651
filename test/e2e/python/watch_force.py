"""The official Python client (Debian's python3-kubernetes) against a real `fluxctl serve`.

Usage: python3 watch_force.py KUBECONFIG NAMESPACE

The client sends booleans as Python prints them (watch=True, force=True): kube converts
them, and so must we. Prints one JSON object with what happened; exits non-zero on an
unexpected error. Every watch has a timeout, so the script always ends.
"""
import json
import sys

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

kubeconfig, ns = sys.argv[1], sys.argv[2]
config.load_kube_config(config_file=kubeconfig)
api = client.ApiClient()
core = client.CoreV1Api(api)
custom = client.CustomObjectsApi(api)
out = {}

# watch=True on a core kind: the list's resourceVersion, then a create seen as ADDED.
rv = core.list_namespaced_secret(ns).metadata.resource_version
core.create_namespaced_secret(ns, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "py-b"}, "stringData": {"k": "v"}})
w = watch.Watch()
for ev in w.stream(core.list_namespaced_secret, ns, resource_version=rv, timeout_seconds=20):
    if ev["object"].metadata.name == "py-b":
        out["secretEvent"] = ev["type"]
        w.stop()

# watch=True on a custom resource: a label patch seen as MODIFIED.
grant = {
    "apiVersion": "fluxvm.dev/v1alpha1",
    "kind": "Grant",
    "metadata": {"name": "py-g"},
    "spec": {"sandboxRef": {"name": "nobody"}, "secretRef": {"name": "py-b", "key": "k"}, "hosts": ["example.com"]},
}
created = custom.create_namespaced_custom_object("fluxvm.dev", "v1alpha1", ns, "grants", grant)
rv = created["metadata"]["resourceVersion"]
custom.patch_namespaced_custom_object("fluxvm.dev", "v1alpha1", ns, "grants", "py-g", {"metadata": {"labels": {"seen": "yes"}}})
w = watch.Watch()
for ev in w.stream(custom.list_namespaced_custom_object, "fluxvm.dev", "v1alpha1", ns, "grants", resource_version=rv, timeout_seconds=20):
    if ev["object"]["metadata"].get("labels", {}).get("seen") == "yes":
        out["grantEvent"] = ev["type"]
        w.stop()


def apply(name, body, force):
    """Server-side apply through the client's own call_api (this client version has no apply helper; a
    string body is sent as is, and JSON is YAML)."""
    query = [("fieldManager", "python")] + ([("force", force)] if force is not None else [])
    return api.call_api(
        "/api/v1/namespaces/{namespace}/secrets/{name}", "PATCH",
        path_params={"namespace": ns, "name": name}, query_params=query,
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        body=json.dumps(body), response_type="object", auth_settings=["BearerToken"], _return_http_data_only=True,
    )


# force=True: a field another manager owns is taken over instead of a 409 Conflict.
core.create_namespaced_secret(ns, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "py-f", "labels": {"owner": "kubectl"}}}, field_manager="kubectl")
mine = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "py-f", "labels": {"owner": "python"}}}
try:
    apply("py-f", mine, None)
    out["withoutForce"] = 200
except ApiException as e:
    out["withoutForce"] = e.status
applied = apply("py-f", mine, True)
out["forcedOwner"] = applied["metadata"]["labels"]["owner"]
print(json.dumps(out))
