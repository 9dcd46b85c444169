// What the libraries export. libhyper_parallel and libhp_train are compiled with
// -fvisibility=hidden: a symbol is exported only when it is declared between
// HP_PUBLIC_BEGIN and HP_PUBLIC_END, which every installed header puts around its
// declarations. So the installed headers are exactly the interface, and nothing of src/
// (the runtime's internals, the file helpers) is reachable from outside, nor clashes with
// a program's own symbols of the same name.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define HP_PUBLIC_BEGIN _Pragma("GCC visibility push(default)")
#define HP_PUBLIC_END _Pragma("GCC visibility pop")
#else
#define HP_PUBLIC_BEGIN
#define HP_PUBLIC_END
#endif
