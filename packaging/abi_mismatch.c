/* Preloaded (LD_PRELOAD) by the wheel and jar tests, this library answers
 * fsdp2_abi_version() in place of libfsdp2 with an ABI of another major
 * number: the bindings must refuse to load with a clear error. */
int fsdp2_abi_version(void);
int fsdp2_abi_version(void) { return 2000; }
