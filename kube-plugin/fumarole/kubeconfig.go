package fumarole

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// kubeconfigYAML writes the scheduler's client configuration (what its --kubeconfig or the
// in-cluster service account gave) as a kubeconfig for the core, which keeps its own client.
// Files stay files (a token file is read again as it rotates); nothing is written to disk.
func kubeconfigYAML(rc *rest.Config) ([]byte, error) {
	if rc == nil || rc.Host == "" {
		return nil, fmt.Errorf("the scheduler has no API server configuration")
	}
	cluster := clientcmdapi.NewCluster()
	cluster.Server = rc.Host + rc.APIPath
	if rc.APIPath == "/api" {
		cluster.Server = rc.Host
	}
	cluster.CertificateAuthority = rc.CAFile
	cluster.CertificateAuthorityData = rc.CAData
	cluster.InsecureSkipTLSVerify = rc.Insecure
	cluster.TLSServerName = rc.ServerName
	user := clientcmdapi.NewAuthInfo()
	user.ClientCertificate = rc.CertFile
	user.ClientCertificateData = rc.CertData
	user.ClientKey = rc.KeyFile
	user.ClientKeyData = rc.KeyData
	user.Token = rc.BearerToken
	user.TokenFile = rc.BearerTokenFile
	user.Username = rc.Username
	user.Password = rc.Password
	config := clientcmdapi.NewConfig()
	config.Clusters["scheduler"] = cluster
	config.AuthInfos["scheduler"] = user
	context := clientcmdapi.NewContext()
	context.Cluster, context.AuthInfo = "scheduler", "scheduler"
	config.Contexts["scheduler"] = context
	config.CurrentContext = "scheduler"
	return clientcmd.Write(*config)
}
