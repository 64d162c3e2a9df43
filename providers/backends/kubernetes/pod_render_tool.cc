// Renders one JSON input (render_input.h) read from stdin, or each file
// named on the command line, to stdout: what the schema test and the
// `podman kube play` test feed on, and how testdata/*.golden.json are
// regenerated (docs/PROVIDERS.md, "Kubernetes backend: Pods").
#include <fstream>
#include <iostream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "providers/backends/kubernetes/render_input.h"

int main(int argc, char** argv) {
  using nlohmann::json;
  auto render = [](std::istream& in) -> int {
    json input = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (input.is_discarded()) {
      std::cerr << "input is not JSON\n";
      return 2;
    }
    auto parsed = agentix::providers::kubernetes::ParseRenderInput(input);
    if (!parsed.ok()) {
      std::cerr << parsed.status().message() << "\n";
      return 2;
    }
    std::cout << agentix::providers::kubernetes::RenderAll(*parsed).dump(2) << "\n";
    return 0;
  };
  if (argc < 2) return render(std::cin);
  for (int i = 1; i < argc; ++i) {
    std::ifstream file(argv[i]);
    if (!file) {
      std::cerr << "cannot read " << argv[i] << "\n";
      return 2;
    }
    if (int rc = render(file); rc != 0) return rc;
  }
  return 0;
}
