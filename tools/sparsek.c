/* STUB */
#include <stdio.h>
#include "sparsek.h"
int main(void) { printf("%s\n", sk_build_info()); return 0; }
