package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// TestManifestsServerSideDryRun submits every object in manifests/ to the real
// kube-apiserver with dryRun=All: the API server's own validation and defaulting (and
// RBAC's escalation check for the ClusterRole) must accept them.
func TestManifestsServerSideDryRun(t *testing.T) {
	c := cluster.StartT(t, cluster.Config{})
	files, err := filepath.Glob(filepath.Join("..", "manifests", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests found: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	objects := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range bytes.Split(data, []byte("\n---")) {
			if len(bytes.TrimSpace(doc)) == 0 || onlyComments(doc) {
				continue
			}
			obj, _, err := strict.UniversalDeserializer().Decode(doc, nil, nil)
			if err != nil {
				t.Errorf("%s: decoding: %v", f, err)
				continue
			}
			objects++
			if err := dryRunCreate(ctx, c.Client, obj); err != nil {
				t.Errorf("%s: %T rejected by the API server: %v", f, obj, err)
			}
		}
	}
	if objects < 4 {
		t.Fatalf("only %d objects in manifests/, want at least a DaemonSet, ServiceAccount, ClusterRole and binding", objects)
	}
}

// strict decoding rejects unknown and duplicate fields, which a typed object would
// otherwise drop silently before the API server could see them.
var strict = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict)

func onlyComments(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		l := bytes.TrimSpace(line)
		if len(l) > 0 && l[0] != '#' {
			return false
		}
	}
	return true
}

func dryRunCreate(ctx context.Context, cs kubernetes.Interface, obj runtime.Object) error {
	opts := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}
	var err error
	switch o := obj.(type) {
	case *appsv1.DaemonSet:
		_, err = cs.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, opts)
	case *corev1.ServiceAccount:
		_, err = cs.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
	case *corev1.ConfigMap:
		_, err = cs.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, opts)
	case *rbacv1.ClusterRole:
		_, err = cs.RbacV1().ClusterRoles().Create(ctx, o, opts)
	case *rbacv1.ClusterRoleBinding:
		_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
	default:
		return errUnknownKind{obj}
	}
	return err
}

type errUnknownKind struct{ obj runtime.Object }

func (e errUnknownKind) Error() string {
	return "the test does not know how to submit " + e.obj.GetObjectKind().GroupVersionKind().String()
}
