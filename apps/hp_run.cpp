// hp_run.cpp — entry point of `hp-run`, the torchrun-like launcher of
// HyperParallel C++. All logic lives in src/launcher (hp_launcher); this file
// only maps its outcomes to exit codes.
#include <exception>
#include <iostream>

#include "launcher.h"

int main(int argc, char** argv) {
  namespace launcher = hyper_parallel::launcher;
  launcher::LaunchOptions options;
  try {
    options = launcher::parse_arguments(argc, argv);
  } catch (const launcher::UsageError& e) {
    std::cerr << "hp-run: error: " << e.what() << "\n"
              << "Run 'hp-run --help' for usage.\n";
    return 2;
  }
  if (options.show_help) {
    std::cout << launcher::usage_text();
    return 0;
  }
  try {
    return launcher::launch(options);
  } catch (const std::exception& e) {
    std::cerr << "hp-run: error: " << e.what() << "\n";
    return 1;
  }
}
