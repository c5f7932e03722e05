#!/bin/bash
# The bash completion (packaging/completion/leasehold.bash) against the programs of this build:
# subcommands after `leasehold`, a subcommand's flags, the daemons' flags, nothing after `--`.
# Usage: completion_test.sh COMPLETION LEASEHOLD LEASEHOLD_LOCKD
set -eu
source "$1"
cli=$2; lockd=$3
complete_words() {  # the candidates for the words given (the last one is being typed)
  COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=()
  __leasehold_complete
  printf '%s\n' "${COMPREPLY[@]}"
}
expect() {  # EXPECTED-WORD WORDS...: EXPECTED-WORD is among the candidates
  local want=$1; shift
  complete_words "$@" | grep -qx -- "$want" || { echo "FAIL: '$*' does not offer $want: $(complete_words "$@" | tr '\n' ' ')"; exit 1; }
}
expect names "$cli" na
expect stats "$cli" ""
expect --json "$cli" names --j
expect --lockd "$cli" show orders --lo
expect --store "$lockd" --st
[ -z "$(complete_words "$cli" run --name x -- sle)" ] || { echo "FAIL: words after -- are the sandbox's command"; exit 1; }
[ -z "$(complete_words "$cli" nmes --j)" ] || { echo "FAIL: an unknown subcommand has no flags"; exit 1; }
echo PASS
