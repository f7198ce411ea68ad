#!/bin/sh
# STUB: replaced by the CLI work.
echo "0 passed, 0 failed"
