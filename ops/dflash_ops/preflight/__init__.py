"""`dflash-serve preflight`'s checks of a cluster before `helm install`."""
