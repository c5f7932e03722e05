module leasehold.dev/leaseholdcheck/goprobe

go 1.19

require leasehold.dev/leaseholdcheck v0.0.0

replace leasehold.dev/leaseholdcheck => ../../../bindings/go/leaseholdcheck
