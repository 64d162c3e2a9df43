// Validates Kubernetes objects against the official OpenAPI schemas as
// packaged by npm kubernetes-models@5 (PROVIDER-SERVICE.md §6.3). Run from
// a directory whose node_modules holds kubernetes-models@5 and yaml@2
// (testing/e2e/test_k8s_schema.py installs them into a cache).
//
// Input (argv[2], a JSON file): [{"name": ..., "object": {...}} |
//                                {"name": ..., "yaml": "<one or more docs>"}]
// Output (stdout): one JSON line per object:
//   {"name", "kind", "ok": true} or {"name", "kind", "ok": false, "error"},
//   plus "object" (the parsed document) for YAML inputs.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const MODELS = {
  "v1/Pod": ["kubernetes-models/v1", "Pod"],
  "v1/Secret": ["kubernetes-models/v1", "Secret"],
  "v1/Service": ["kubernetes-models/v1", "Service"],
  "v1/ServiceAccount": ["kubernetes-models/v1", "ServiceAccount"],
  "apps/v1/Deployment": ["kubernetes-models/apps/v1", "Deployment"],
  "rbac.authorization.k8s.io/v1/Role": ["kubernetes-models/rbac.authorization.k8s.io/v1", "Role"],
  "rbac.authorization.k8s.io/v1/RoleBinding": ["kubernetes-models/rbac.authorization.k8s.io/v1", "RoleBinding"],
  "networking.k8s.io/v1/NetworkPolicy": ["kubernetes-models/networking.k8s.io/v1", "NetworkPolicy"],
};

async function check(name, object) {
  const key = `${object?.apiVersion}/${object?.kind}`;
  const model = MODELS[key];
  if (!model) return { name, kind: key, ok: false, error: `no schema model for ${key}` };
  const module = await import(model[0]);
  try {
    new module[model[1]](object).validate();
    return { name, kind: key, ok: true };
  } catch (e) {
    return { name, kind: key, ok: false, error: String(e?.message ?? e) };
  }
}

const inputs = JSON.parse(readFileSync(process.argv[2], "utf8"));
for (const input of inputs) {
  let objects = [];
  if (input.yaml !== undefined) {
    for (const [i, doc] of parseAllDocuments(input.yaml).entries()) {
      if (doc.errors.length) {
        console.log(JSON.stringify({ name: `${input.name}#${i}`, ok: false,
                                     error: `YAML: ${doc.errors[0].message}` }));
        continue;
      }
      objects.push([`${input.name}#${i}`, doc.toJS()]);
    }
  } else {
    objects.push([input.name, input.object]);
  }
  for (const [name, object] of objects) {
    const result = await check(name, object);
    if (input.yaml !== undefined) result.object = object;
    console.log(JSON.stringify(result));
  }
}
