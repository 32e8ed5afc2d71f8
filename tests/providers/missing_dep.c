/* SPDX-License-Identifier: Apache-2.0 */
/* A dependency the broken_dep provider links against and that the loader
 * cannot find at run time: it is built outside every search path and the
 * provider carries no RPATH to it. */
__attribute__((visibility("default"))) int wia_test_missing_dep_function(void) { return 0; }
