// A library that exports one symbol of src/'s internals (hyper_parallel::compat is declared
// only under src/): Build.ExportCheckFindsAPlantedInternalSymbol runs
// tests/scripts/check_exported_symbols.py on it and expects that symbol to be reported.
namespace hyper_parallel::compat {

__attribute__((visibility("default"))) int planted_internal_symbol() { return 1; }

}  // namespace hyper_parallel::compat
