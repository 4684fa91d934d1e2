// The plain Catch2 main, for a test program that needs neither MPI nor a CUDA device.
#include "catch_session.h"

int main(int argc, char** argv) { return ddp_test::run_catch_session(argc, argv); }
