package serve

import (
	"context"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
)

// WatchNode watches the Node called name until ctx ends and returns a function giving
// its latest state (nil while unknown or after it is deleted). It is one watch on one
// object, for Health.Node.
func WatchNode(ctx context.Context, client kubernetes.Interface, name string) func() *v1.Node {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	lister := factory.Core().V1().Nodes().Lister()
	factory.Start(ctx.Done())
	return func() *v1.Node {
		n, err := lister.Get(name)
		if err != nil {
			return nil
		}
		return n
	}
}
