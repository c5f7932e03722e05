module leasehold.dev/leaseholdcheck

go 1.19
