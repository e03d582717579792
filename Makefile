# Local Kubernetes control plane for integration tests (see tests/cluster/README.md).
# `make -s cluster-up` prints only the kubeconfig path on stdout:
#   export KUBECONFIG=$(make -s cluster-up)

.PHONY: cluster-build cluster-up cluster-down

cluster-build: ## build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok
	@bash tests/cluster/build.sh

cluster-up: ## start (or reuse) the control plane; last stdout line is the kubeconfig path
	@bash tests/cluster/up.sh

cluster-down: ## stop it and remove .cluster/
	@bash tests/cluster/down.sh
