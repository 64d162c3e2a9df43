#include "providers/backends/kubernetes/kube_config.h"

#include <yaml.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace agentix::providers::kubernetes {
namespace {

using json = nlohmann::json;

// A kubeconfig is small; a larger file is not one.
constexpr size_t kMaxFileBytes = 4 << 20;

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", what, " ", path, ": ", std::strerror(errno)));
  }
  std::string data;
  char buf[8192];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    data.append(buf, in.gcount());
    if (data.size() > kMaxFileBytes) {
      return absl::FailedPreconditionError(absl::StrCat(what, " ", path, " is too large"));
    }
  }
  return data;
}

// libyaml's document tree -> JSON, every scalar as a string (a kubeconfig
// has no field whose meaning depends on YAML typing beyond "true").
json NodeToJson(yaml_document_t* doc, yaml_node_t* node, int depth) {
  if (node == nullptr || depth > 64) return nullptr;
  switch (node->type) {
    case YAML_SCALAR_NODE:
      return std::string(reinterpret_cast<const char*>(node->data.scalar.value),
                         node->data.scalar.length);
    case YAML_SEQUENCE_NODE: {
      json out = json::array();
      for (yaml_node_item_t* item = node->data.sequence.items.start;
           item < node->data.sequence.items.top; ++item) {
        out.push_back(NodeToJson(doc, yaml_document_get_node(doc, *item), depth + 1));
      }
      return out;
    }
    case YAML_MAPPING_NODE: {
      json out = json::object();
      for (yaml_node_pair_t* pair = node->data.mapping.pairs.start;
           pair < node->data.mapping.pairs.top; ++pair) {
        json key = NodeToJson(doc, yaml_document_get_node(doc, pair->key), depth + 1);
        if (!key.is_string()) continue;
        out[key.get<std::string>()] =
            NodeToJson(doc, yaml_document_get_node(doc, pair->value), depth + 1);
      }
      return out;
    }
    default:
      return nullptr;
  }
}

absl::StatusOr<json> ParseYaml(const std::string& text, const std::string& path) {
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) return absl::ResourceExhaustedError("yaml parser");
  yaml_parser_set_input_string(&parser, reinterpret_cast<const unsigned char*>(text.data()),
                               text.size());
  yaml_document_t doc;
  if (!yaml_parser_load(&parser, &doc)) {
    std::string msg = absl::StrCat("kubeconfig ", path, " is not valid YAML: ",
                                   parser.problem ? parser.problem : "parse error", " at line ",
                                   parser.problem_mark.line + 1);
    yaml_parser_delete(&parser);
    return absl::InvalidArgumentError(msg);
  }
  json out = NodeToJson(&doc, yaml_document_get_root_node(&doc), 0);
  yaml_document_delete(&doc);
  yaml_parser_delete(&parser);
  return out;
}

std::string Str(const json& obj, const char* key) {
  if (!obj.is_object()) return "";
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

// The entry named `name` of a kubeconfig list (clusters, users, contexts).
const json* Named(const json& root, const char* list, const std::string& name,
                  const char* inner) {
  auto it = root.find(list);
  if (it == root.end() || !it->is_array()) return nullptr;
  for (const json& entry : *it) {
    if (Str(entry, "name") == name && entry.contains(inner) && entry[inner].is_object()) {
      return &entry[inner];
    }
  }
  return nullptr;
}

std::string Resolve(const std::string& base_dir, const std::string& file) {
  if (file.empty() || file[0] == '/') return file;
  return (std::filesystem::path(base_dir) / file).string();
}

// "<field>-data" (base64) wins over "<field>" (a file), as in client-go.
absl::Status DataOrFile(const json& obj, const std::string& field, const std::string& base_dir,
                        std::string* out) {
  std::string data = Str(obj, (field + "-data").c_str());
  if (!data.empty()) {
    auto decoded = DecodeBase64Field(field + "-data", data);
    if (!decoded.ok()) return decoded.status();
    *out = *std::move(decoded);
    return absl::OkStatus();
  }
  std::string file = Str(obj, field.c_str());
  if (file.empty()) return absl::OkStatus();
  auto read = ReadFile(Resolve(base_dir, file), field);
  if (!read.ok()) return read.status();
  *out = *std::move(read);
  return absl::OkStatus();
}

std::string TrimServer(std::string server) {
  while (!server.empty() && server.back() == '/') server.pop_back();
  return server;
}

}  // namespace

absl::StatusOr<std::string> DecodeBase64Field(absl::string_view field, absl::string_view value) {
  std::string compact;
  for (char c : value) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(c))) compact.push_back(c);
  }
  std::string out;
  if (!absl::Base64Unescape(compact, &out)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is not valid base64"));
  }
  return out;
}

absl::StatusOr<KubeConfig> LoadKubeconfig(const std::string& path, const std::string& context) {
  auto text = ReadFile(path, "kubeconfig");
  if (!text.ok()) return text.status();
  auto root = ParseYaml(*text, path);
  if (!root.ok()) return root.status();
  if (!root->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("kubeconfig ", path, " is not a mapping"));
  }
  std::string base_dir = std::filesystem::path(path).parent_path().string();
  std::string ctx_name = context.empty() ? Str(*root, "current-context") : context;
  if (ctx_name.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("kubeconfig ", path, " has no current-context; pass a context"));
  }
  const json* ctx = Named(*root, "contexts", ctx_name, "context");
  if (ctx == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("kubeconfig ", path, " has no context '", ctx_name, "'"));
  }
  KubeConfig config;
  config.source = absl::StrCat("kubeconfig ", path, " (context ", ctx_name, ")");
  config.ns = Str(*ctx, "namespace");
  if (config.ns.empty()) config.ns = "default";
  std::string cluster_name = Str(*ctx, "cluster");
  const json* cluster = Named(*root, "clusters", cluster_name, "cluster");
  if (cluster == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kubeconfig ", path, ": context '", ctx_name, "' names cluster '", cluster_name,
        "', which is not in clusters"));
  }
  config.server = TrimServer(Str(*cluster, "server"));
  if (!absl::StartsWith(config.server, "https://") &&
      !absl::StartsWith(config.server, "http://")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kubeconfig ", path, ": cluster '", cluster_name, "' has no http(s) server ('",
        config.server, "')"));
  }
  config.insecure_skip_tls_verify = Str(*cluster, "insecure-skip-tls-verify") == "true";
  if (absl::Status s = DataOrFile(*cluster, "certificate-authority", base_dir, &config.ca_pem);
      !s.ok()) {
    return s;
  }
  std::string user_name = Str(*ctx, "user");
  if (!user_name.empty()) {
    const json* user = Named(*root, "users", user_name, "user");
    if (user == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "kubeconfig ", path, ": context '", ctx_name, "' names user '", user_name,
          "', which is not in users"));
    }
    if (user->contains("exec") || user->contains("auth-provider")) {
      return absl::FailedPreconditionError(absl::StrCat(
          "kubeconfig ", path, ": user '", user_name,
          "' uses a credential plugin (exec/auth-provider), which agentix-providerd does not "
          "run; use a token, a token file or a client certificate"));
    }
    config.token = Str(*user, "token");
    std::string token_file = Str(*user, "tokenFile");
    if (config.token.empty() && !token_file.empty()) {
      config.token_file = Resolve(base_dir, token_file);
      auto token = ReadFile(config.token_file, "token file");
      if (!token.ok()) return token.status();
      config.token = std::string(absl::StripAsciiWhitespace(*token));
    }
    if (absl::Status s =
            DataOrFile(*user, "client-certificate", base_dir, &config.client_cert_pem);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = DataOrFile(*user, "client-key", base_dir, &config.client_key_pem);
        !s.ok()) {
      return s;
    }
    if (config.client_cert_pem.empty() != config.client_key_pem.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "kubeconfig ", path, ": user '", user_name,
          "' has a client certificate without its key (or a key without its certificate)"));
    }
  }
  return config;
}

absl::StatusOr<KubeConfig> LoadInCluster(const std::string& root, const EnvFn& getenv_fn) {
  auto env = [&](const char* name) -> std::string {
    if (getenv_fn) return getenv_fn(name);
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  std::string host = env("KUBERNETES_SERVICE_HOST");
  std::string port = env("KUBERNETES_SERVICE_PORT");
  if (host.empty() || port.empty()) {
    return absl::FailedPreconditionError(
        "not running in a Kubernetes Pod: KUBERNETES_SERVICE_HOST/PORT are not set "
        "(pass --kubernetes-kubeconfig)");
  }
  KubeConfig config;
  config.source = "in-cluster service account";
  bool v6 = host.find(':') != std::string::npos;
  config.server = absl::StrCat("https://", v6 ? "[" : "", host, v6 ? "]" : "", ":", port);
  config.token_file = root + "/token";
  auto token = ReadFile(config.token_file, "service account token");
  if (!token.ok()) return token.status();
  config.token = std::string(absl::StripAsciiWhitespace(*token));
  auto ca = ReadFile(root + "/ca.crt", "service account CA");
  if (!ca.ok()) return ca.status();
  config.ca_pem = *std::move(ca);
  auto ns = ReadFile(root + "/namespace", "service account namespace");
  config.ns = ns.ok() ? std::string(absl::StripAsciiWhitespace(*ns)) : "";
  if (config.ns.empty()) config.ns = "default";
  return config;
}

}  // namespace agentix::providers::kubernetes
