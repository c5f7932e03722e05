// The executable that builds the tests' precompiled header (tests/CMakeLists.txt); never run.
int main() { return 0; }
