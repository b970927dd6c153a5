package serve

import (
	"context"
	"errors"
	"io"

	"github.com/go-logr/logr"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// WatchNode watches the Node called name until ctx ends and returns a function giving
// its latest state (nil while unknown or after it is deleted). It is one watch on one
// object, for Health.Node.
func WatchNode(ctx context.Context, log logr.Logger, client kubernetes.Interface, name string) func() *v1.Node {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	inf := factory.Core().V1().Nodes()
	lister := inf.Lister()
	// The controller logs failing API requests (rate-limited, with the address); this
	// second watch of the same server only adds detail at -v=4.
	_ = inf.Informer().SetWatchErrorHandlerWithContext(func(_ context.Context, r *cache.Reflector, err error) {
		if !errors.Is(err, io.EOF) {
			log.V(4).Info("Watching this node failed; retrying", "node", name, "err", err)
		}
	})
	factory.Start(ctx.Done())
	return func() *v1.Node {
		n, err := lister.Get(name)
		if err != nil {
			return nil
		}
		return n
	}
}
