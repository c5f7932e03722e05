# bash completion for leasehold (the CLI), leasehold-lockd and leasehold-supervisor.
# Subcommands and flags are read from the programs' own --help, so they never go stale.
# Installed as /usr/share/bash-completion/completions/leasehold (and linked for the daemons).

# The subcommands of `leasehold --help` (the lines under "Subcommands:").
__leasehold_subcommands() {
  "$1" --help 2>/dev/null | sed -n '/^Subcommands:/,/^$/s/^  \([a-z][a-z0-9-]*\) .*/\1/p'
}

# The flags of `PROG [SUB] --help` (every --flag and -f the help lists).
__leasehold_flags() {
  "$@" --help 2>/dev/null | grep -o -- '\(^\|[ ,]\)--\?[A-Za-z][A-Za-z0-9-]*' | tr -d ' ,' | sort -u
}

__leasehold_complete() {
  local cur=${COMP_WORDS[COMP_CWORD]} prog=${COMP_WORDS[0]} sub="" i
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${COMP_WORDS[i]} in
      --) compopt -o default 2>/dev/null; COMPREPLY=(); return 0 ;;  # the sandbox's command
      -*) ;;
      *) [[ -z $sub ]] && sub=${COMP_WORDS[i]} ;;
    esac
  done
  if [[ $prog == *leasehold-lockd || $prog == *leasehold-supervisor ]]; then
    COMPREPLY=($(compgen -W "$(__leasehold_flags "$prog")" -- "$cur"))
  elif [[ -z $sub ]]; then
    COMPREPLY=($(compgen -W "$(__leasehold_subcommands "$prog") --help --version" -- "$cur"))
  elif [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$(__leasehold_flags "$prog" "$sub")" -- "$cur"))
  else
    compopt -o default 2>/dev/null
    COMPREPLY=()
  fi
}
complete -F __leasehold_complete leasehold leasehold-lockd leasehold-supervisor
