// A shared library that is not a rule plugin: it lacks hyper_parallel_register_ops.
extern "C" int not_a_plugin() { return 42; }
