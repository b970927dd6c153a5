package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

// ManifestsDir is the repository's manifests/ directory.
func ManifestsDir() string { return filepath.Join(filepath.Dir(e2eDir()), "manifests") }

// RBAC is the identity the manifests give nftproxy: its ServiceAccount, ClusterRole and
// the ClusterRoleBinding of the one to the other.
type RBAC struct {
	ServiceAccount *corev1.ServiceAccount
	ClusterRole    *rbacv1.ClusterRole
	Binding        *rbacv1.ClusterRoleBinding
}

// ManifestRBAC reads every *.yaml in dir with apimachinery's YAML decoder and returns
// its ServiceAccount, ClusterRole and ClusterRoleBinding. It fails unless there is
// exactly one of each and the binding binds that role to that ServiceAccount.
func ManifestRBAC(dir string) (*RBAC, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var r RBAC
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			if doc == nil { // an empty or comment-only document
				continue
			}
			var into any
			switch kind := doc["kind"]; kind {
			case "ServiceAccount":
				if r.ServiceAccount != nil {
					return nil, fmt.Errorf("%s: a second ServiceAccount", file)
				}
				r.ServiceAccount = &corev1.ServiceAccount{}
				into = r.ServiceAccount
			case "ClusterRole":
				if r.ClusterRole != nil {
					return nil, fmt.Errorf("%s: a second ClusterRole", file)
				}
				r.ClusterRole = &rbacv1.ClusterRole{}
				into = r.ClusterRole
			case "ClusterRoleBinding":
				if r.Binding != nil {
					return nil, fmt.Errorf("%s: a second ClusterRoleBinding", file)
				}
				r.Binding = &rbacv1.ClusterRoleBinding{}
				into = r.Binding
			default:
				continue
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(doc, into); err != nil {
				return nil, fmt.Errorf("%s: %v: %w", file, doc["kind"], err)
			}
		}
	}
	if r.ServiceAccount == nil || r.ClusterRole == nil || r.Binding == nil {
		return nil, fmt.Errorf("%s: want a ServiceAccount, a ClusterRole and a ClusterRoleBinding, got %+v", dir, r)
	}
	sa := r.ServiceAccount
	if r.Binding.RoleRef.Kind != "ClusterRole" || r.Binding.RoleRef.Name != r.ClusterRole.Name {
		return nil, fmt.Errorf("ClusterRoleBinding %s refers to %s %s, not ClusterRole %s", r.Binding.Name, r.Binding.RoleRef.Kind, r.Binding.RoleRef.Name, r.ClusterRole.Name)
	}
	bound := false
	for _, s := range r.Binding.Subjects {
		bound = bound || (s.Kind == "ServiceAccount" && s.Name == sa.Name && s.Namespace == sa.Namespace)
	}
	if !bound {
		return nil, fmt.Errorf("ClusterRoleBinding %s does not bind ServiceAccount %s/%s", r.Binding.Name, sa.Namespace, sa.Name)
	}
	return &r, nil
}

// Username is the ServiceAccount's user name in the API (system:serviceaccount:ns:name).
func (r *RBAC) Username() string {
	return "system:serviceaccount:" + r.ServiceAccount.Namespace + ":" + r.ServiceAccount.Name
}

// LeastPrivilegeKubeconfig applies the ServiceAccount, ClusterRole and
// ClusterRoleBinding of manifests/ (ManifestRBAC) to the cluster, mints a token for the
// ServiceAccount with the TokenRequest API (valid 24 h) and writes a kubeconfig using
// it: WorkDir/kubeconfig-<serviceaccount>. nftproxy started with it has exactly the
// rights the DaemonSet's pods get. Later calls return the same file.
func (c *Cluster) LeastPrivilegeKubeconfig(ctx context.Context) (string, error) {
	r, err := ManifestRBAC(ManifestsDir())
	if err != nil {
		return "", err
	}
	sa := r.ServiceAccount
	path := filepath.Join(c.WorkDir, "kubeconfig-"+sa.Name)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := apply(ctx, c.Client, r); err != nil {
		return "", err
	}
	tr, err := c.Client.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s: %w", r.Username(), err)
	}
	kc := Kubeconfig(c.apiserverURL(), nil, sa.Name, tr.Status.Token)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		return "", err
	}
	c.logf("cluster %s: kubeconfig for %s (ClusterRole %s from manifests/): %s", c.Prefix, r.Username(), r.ClusterRole.Name, path)
	return path, nil
}

// LeastPrivilegeKubeconfigT is LeastPrivilegeKubeconfig failing t on error.
func (c *Cluster) LeastPrivilegeKubeconfigT(t testing.TB) string {
	t.Helper()
	path, err := c.LeastPrivilegeKubeconfig(t.Context())
	if err != nil {
		t.Fatalf("least-privilege kubeconfig: %v", err)
	}
	return path
}

// apply creates the objects, or updates them if they exist.
func apply(ctx context.Context, cs kubernetes.Interface, r *RBAC) error {
	sa := r.ServiceAccount.DeepCopy()
	if _, err := cs.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("ServiceAccount %s/%s: %w", sa.Namespace, sa.Name, err)
	}
	roles := cs.RbacV1().ClusterRoles()
	role := r.ClusterRole.DeepCopy()
	if _, err := roles.Create(ctx, role, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		old, gerr := roles.Get(ctx, role.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		role.ResourceVersion = old.ResourceVersion
		_, err = roles.Update(ctx, role, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("ClusterRole %s: %w", role.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("ClusterRole %s: %w", role.Name, err)
	}
	bindings := cs.RbacV1().ClusterRoleBindings()
	b := r.Binding.DeepCopy()
	if _, err := bindings.Create(ctx, b, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		old, gerr := bindings.Get(ctx, b.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		b.ResourceVersion = old.ResourceVersion
		_, err = bindings.Update(ctx, b, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("ClusterRoleBinding %s: %w", b.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("ClusterRoleBinding %s: %w", b.Name, err)
	}
	return nil
}

// ClientFor returns a client using the kubeconfig file at path (e.g. the one of
// LeastPrivilegeKubeconfig), dialling from the node namespace like c.Client.
func (c *Cluster) ClientFor(path string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, err
	}
	cfg.Dial = NSDialer(c.NodeNS)
	cfg.Timeout = 30 * time.Second
	return kubernetes.NewForConfig(cfg)
}
